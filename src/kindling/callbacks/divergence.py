"""Stop a run whose training loss became NaN or inf, naming the step, instead of going on."""

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from kindling.errors import UserError


class DivergenceError(UserError):
    """The training loss stopped being a finite number (on every rank at the same step)."""


class StopOnDivergence(Callback):
    """Raise `DivergenceError` when the training loss is NaN or inf, checked every
    `check_every_n_steps` steps and at epoch ends (one host sync per check). The ranks reduce
    one flag and stop together: one that stopped alone would leave the others waiting."""

    def __init__(self, check_every_n_steps: int = 50):
        self.check_every_n_steps = check_every_n_steps
        self._last_loss: torch.Tensor | None = None
        self._last_step = 0
        self._checked_step: int | None = None

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, *_: Any) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None:  # a reference: nothing runs on the device here
            self._last_loss, self._last_step = loss, trainer.global_step
        if trainer.global_step % self.check_every_n_steps == 0:  # the same on every rank
            self.on_train_epoch_end(trainer, pl_module)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if self._checked_step == trainer.global_step:  # accumulating, or the epoch's last step
            return
        self._checked_step = trainer.global_step
        loss = self._last_loss
        if loss is None:  # no loss yet: this rank takes part in the reduction all the same
            loss = torch.zeros((), device=trainer.strategy.root_device)
        not_finite = (~loss.detach().isfinite()).float()
        if bool(trainer.strategy.reduce(not_finite, reduce_op="sum") > 0):
            where = f" on at least one of {trainer.world_size} processes" * (trainer.world_size > 1)
            raise DivergenceError(
                f"The training loss was NaN or inf at step {self._last_step}{where} (it is "
                f"checked every {self.check_every_n_steps} steps and at epoch ends). Try a lower "
                "learning rate (model.optimizer.lr), gradient clipping "
                "(trainer.gradient_clip_val=1.0), or bf16-mixed / 32-true precision instead of "
                "16-mixed."
            )
