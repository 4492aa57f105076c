"""Callbacks Lightning does not already provide. The default set is built from Lightning's own."""

from kindling.callbacks.config_in_checkpoint import ConfigInCheckpoint
from kindling.callbacks.divergence import DivergenceError, StopOnDivergence

__all__ = ["ConfigInCheckpoint", "DivergenceError", "StopOnDivergence"]
