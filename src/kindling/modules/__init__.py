"""LightningModules: a task (loss, metrics, optimisation) wrapped around any plain net."""

from kindling.lazy_exports import lazy_exports

MODULES = {"classifier": ["Classifier"], "language_model": ["LanguageModel"]}
__getattr__, __all__ = lazy_exports(__name__, MODULES)
