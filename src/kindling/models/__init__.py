"""Plain `nn.Module`s: usable with or without Lightning. Configs name each by its module's path."""
