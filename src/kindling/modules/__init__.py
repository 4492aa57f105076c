"""LightningModules: a task (loss, metrics, optimisation) wrapped around any plain net."""

from kindling.modules.classifier import Classifier
from kindling.modules.language_model import LanguageModel

__all__ = ["Classifier", "LanguageModel"]
