"""kindling: a PyTorch Lightning + Hydra starter for training neural networks on GPUs."""

__version__ = "0.1.0"
