"""Plain `nn.Module`s: usable with or without Lightning."""

from kindling.models.cnn import CNNClassifier
from kindling.models.language_models import (
    GRULanguageModel,
    LSTMLanguageModel,
    RNNLanguageModel,
    TransformerLanguageModel,
)
from kindling.models.recurrent import GRUClassifier, LSTMClassifier, RNNClassifier
from kindling.models.transformer import TransformerClassifier

__all__ = [
    "CNNClassifier",
    "GRUClassifier",
    "GRULanguageModel",
    "LSTMClassifier",
    "LSTMLanguageModel",
    "RNNClassifier",
    "RNNLanguageModel",
    "TransformerClassifier",
    "TransformerLanguageModel",
]
