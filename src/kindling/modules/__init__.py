"""LightningModules: a task (loss, metrics, optimisation) wrapped around any plain net."""

from kindling.modules.classifier import Classifier

__all__ = ["Classifier"]
