"""Report a trial's metric to Optuna after each validation; stop the run when the pruner says so."""

from typing import TYPE_CHECKING, Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

if TYPE_CHECKING:  # Optuna loads only when a trial is opened
    import optuna


class OptunaPruning(Callback):
    """Prune an Optuna trial by `monitor` (the sweep's `optimized_metric`), reported after each
    validation (its step: the n-th validation) to `pruner`. The trial is opened again from
    `storage` by `study_name` and `trial_number`, wherever Hydra runs it (without them, outside a
    sweep, nothing is reported); under DDP rank 0 alone talks to Optuna and broadcasts the
    decision. A pruned run stops training and skips its test; the sweeper records it as PRUNED.
    """

    def __init__(
        self,
        monitor: str,
        pruner: "optuna.pruners.BasePruner",
        storage: Any = None,
        study_name: str | None = None,
        trial_number: int | None = None,
    ) -> None:
        self.monitor, self.pruner = monitor, pruner
        self.storage, self.study_name, self.trial_number = storage, study_name, trial_number
        self.trial: optuna.Trial | None = None
        self.validations = 0
        self.pruned = False

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        located = None not in (self.storage, self.study_name, self.trial_number)
        if trainer.is_global_zero and located:
            from kindling.optuna_sweep import load_trial

            self.trial = load_trial(self.storage, self.study_name, self.trial_number, self.pruner)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.sanity_checking:
            return
        step = self.validations
        self.validations += 1
        prune = False
        if self.trial is not None:
            value = trainer.callback_metrics.get(self.monitor)
            if value is None:
                rank_zero_warn(f"OptunaPruning: {self.monitor!r} was not logged; not reported.")
            else:
                self.trial.report(float(value), step)
                prune = self.trial.should_prune()
        # Every rank takes rank 0's decision: they must stop at the same validation.
        prune = trainer.strategy.broadcast(prune, src=0)
        if prune:
            self.pruned = True
            trainer.should_stop = True
            trainer.limit_test_batches = 0  # the run ends with its fit; the sweep moves on
            if self.trial is not None:
                self.trial.set_user_attr("pruned_at_validation", step)
                rank_zero_info(f"Optuna pruned this trial at validation {step}: stopping.")
