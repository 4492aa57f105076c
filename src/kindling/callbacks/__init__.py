"""Callbacks Lightning does not already provide. The default set is built from Lightning's own."""

from kindling.lazy_exports import lazy_exports

MODULES = {
    "config_in_checkpoint": ["ConfigInCheckpoint"],
    "continue_metrics": ["ContinueLoggedMetrics"],
    "device_usage": ["DeviceReport"],
    "divergence": ["DivergenceError", "StopOnDivergence"],
    "ema": ["EMAWeights"],
    "interrupt": ["CheckpointOnInterrupt"],
    "optuna_pruning": ["OptunaPruning"],
    "plots": ["RunPlots"],
    "resume": ["ResumeExactly"],
}
__getattr__, __all__ = lazy_exports(__name__, MODULES)
