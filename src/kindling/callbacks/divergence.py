"""Stop a run whose training loss became NaN or inf, naming the step, instead of going on."""

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from kindling.utils.errors import UserError


class DivergenceError(UserError):
    """The training loss stopped being a finite number."""


class StopOnDivergence(Callback):
    """Raise `DivergenceError` when a training loss is NaN or inf.

    The check reads the loss on the device every step (no host sync) and looks at the result
    every `check_every_n_steps` steps, so it costs one sync per check, not one per step.
    """

    def __init__(self, check_every_n_steps: int = 50):
        self.check_every_n_steps = check_every_n_steps
        self._first_bad_step: torch.Tensor | None = None

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is None:
            return
        step = trainer.global_step
        if self._first_bad_step is None:
            self._first_bad_step = torch.full((), -1, dtype=torch.long, device=loss.device)
        newly_bad = ~torch.isfinite(loss.detach()) & (self._first_bad_step < 0)
        self._first_bad_step = torch.where(newly_bad, step, self._first_bad_step)
        if step % self.check_every_n_steps == 0:
            self._raise_if_diverged()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._raise_if_diverged()

    def _raise_if_diverged(self) -> None:
        if self._first_bad_step is None:
            return
        step = int(self._first_bad_step)
        if step >= 0:
            raise DivergenceError(
                f"The training loss became NaN or inf at step {step}. Try a lower learning rate "
                "(model.optimizer.lr), gradient clipping (trainer.gradient_clip_val=1.0), or "
                "bf16-mixed / 32-true precision instead of 16-mixed."
            )
