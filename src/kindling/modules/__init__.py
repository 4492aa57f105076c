"""LightningModules: a task (loss, metrics, optimisation) wrapped around any plain net."""

from kindling.lazy_exports import lazy_exports

MODULES = {"classifier": ["Classifier"], "language_model": ["LanguageModel"]}
__all__ = sorted(name for names in MODULES.values() for name in names)
__getattr__ = lazy_exports(__name__, MODULES)
