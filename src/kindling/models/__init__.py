"""Plain `nn.Module`s: usable with or without Lightning."""

from kindling.lazy_exports import lazy_exports

MODULES = {
    "cnn": ["CNNClassifier"],
    "language_models": [
        "GRULanguageModel", "LSTMLanguageModel", "RNNLanguageModel", "TransformerLanguageModel",
    ],
    "recurrent": ["GRUClassifier", "LSTMClassifier", "RNNClassifier"],
    "temporal_conv": ["TemporalConvClassifier"],
    "timm_net": ["TimmClassifier"],
    "transformer": ["TransformerClassifier"],
}  # fmt: skip
__getattr__, __all__ = lazy_exports(__name__, MODULES)
