"""Plain `nn.Module`s: usable with or without Lightning."""

from kindling.lazy_exports import lazy_exports

MODULES = {
    "cnn": ["CNNClassifier"],
    "language_models": [
        "GRULanguageModel", "LSTMLanguageModel", "RNNLanguageModel", "TransformerLanguageModel",
    ],
    "recurrent": ["GRUClassifier", "LSTMClassifier", "RNNClassifier"],
    "transformer": ["TransformerClassifier"],
}  # fmt: skip
__all__ = sorted(name for names in MODULES.values() for name in names)
__getattr__ = lazy_exports(__name__, MODULES)
