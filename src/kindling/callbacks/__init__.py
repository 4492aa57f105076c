"""Callbacks Lightning does not already provide. The default set is built from Lightning's own."""

from kindling.callbacks.config_in_checkpoint import ConfigInCheckpoint
from kindling.callbacks.continue_metrics import ContinueMetrics
from kindling.callbacks.device_report import DeviceReport
from kindling.callbacks.divergence import DivergenceError, StopOnDivergence
from kindling.callbacks.interrupt import CheckpointOnInterrupt
from kindling.callbacks.optuna_pruning import OptunaPruning
from kindling.callbacks.plots import RunPlots
from kindling.callbacks.resume import ResumeExactly

__all__ = [
    "CheckpointOnInterrupt",
    "ConfigInCheckpoint",
    "ContinueMetrics",
    "DeviceReport",
    "DivergenceError",
    "OptunaPruning",
    "ResumeExactly",
    "RunPlots",
    "StopOnDivergence",
]
