"""Callbacks Lightning does not already provide. The default set is built from Lightning's own."""

from kindling.callbacks.config_in_checkpoint import ConfigInCheckpoint

__all__ = ["ConfigInCheckpoint"]
