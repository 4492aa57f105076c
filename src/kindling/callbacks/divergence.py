"""Stop a run whose training loss became NaN or inf, naming the step, instead of going on."""

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from kindling.utils.errors import UserError


class DivergenceError(UserError):
    """The training loss stopped being a finite number."""


class StopOnDivergence(Callback):
    """Raise `DivergenceError` when the training loss is NaN or inf.

    The loss is read every `check_every_n_steps` steps and at the end of each epoch: one
    host-device sync per check and no work at all on the other steps. A loss that diverged stays
    NaN (the weights turn NaN with it), so a check a few steps later still catches it.
    """

    def __init__(self, check_every_n_steps: int = 50):
        self.check_every_n_steps = check_every_n_steps
        self._last_loss: torch.Tensor | None = None
        self._last_step = 0

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
        # A reference, not a copy: nothing runs on the device here.
        self._last_loss, self._last_step = loss, trainer.global_step
        if trainer.global_step % self.check_every_n_steps == 0:
            self._raise_if_diverged()

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._raise_if_diverged()

    def _raise_if_diverged(self) -> None:
        if self._last_loss is not None and not torch.isfinite(self._last_loss.detach()):
            raise DivergenceError(
                f"The training loss was NaN or inf at step {self._last_step} (it is checked every "
                f"{self.check_every_n_steps} steps and at epoch ends). Try a lower learning rate "
                "(model.optimizer.lr), gradient clipping (trainer.gradient_clip_val=1.0), or "
                "bf16-mixed / 32-true precision instead of 16-mixed."
            )
