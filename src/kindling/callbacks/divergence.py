"""Stop a run whose training loss became NaN or inf, naming the step, instead of going on."""

from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

from kindling.config.errors import UserError


class DivergenceError(UserError):
    """The training loss stopped being a finite number."""

    # Every rank decides together and raises it at the same step: rank 0 prints it.
    raised_on_every_rank = True


class StopOnDivergence(Callback):
    """Raise `DivergenceError` when the training loss is NaN or inf.

    The loss is read every `check_every_n_steps` steps and at the end of each epoch: one
    host-device sync per check and no work at all on the other steps. A loss that diverged stays
    NaN (the weights turn NaN with it), so a check a few steps later still catches it.

    With several processes, the ranks reduce one flag at each check ("is any loss not finite?")
    and all stop at the same step: a rank that stopped alone would leave the others waiting in
    the next gradient all-reduce (a connection error with gloo, the collective timeout with NCCL).
    """

    def __init__(self, check_every_n_steps: int = 50):
        self.check_every_n_steps = check_every_n_steps
        self._last_loss: torch.Tensor | None = None
        self._last_step = 0
        self._checked_step: int | None = None

    def on_train_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        loss = outputs["loss"] if isinstance(outputs, dict) else outputs
        if loss is not None:
            # A reference, not a copy: nothing runs on the device here.
            self._last_loss, self._last_step = loss, trainer.global_step
        # Decided by the step alone, the same on every rank, so all ranks join the reduction.
        if trainer.global_step % self.check_every_n_steps == 0:
            self._raise_if_diverged(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._raise_if_diverged(trainer)

    def _raise_if_diverged(self, trainer: L.Trainer) -> None:
        if self._checked_step == trainer.global_step:  # accumulating, or the epoch's last step
            return
        self._checked_step = trainer.global_step
        loss = self._last_loss
        if loss is None:
            not_finite = torch.zeros((), device=trainer.strategy.root_device)
        else:
            not_finite = (~torch.isfinite(loss.detach())).float()
        # Summed over the ranks on the device, then read: one host sync per check.
        if bool(trainer.strategy.reduce(not_finite, reduce_op="sum") > 0):
            where = f" on at least one of {trainer.world_size} processes" * (trainer.world_size > 1)
            raise DivergenceError(
                f"The training loss was NaN or inf at step {self._last_step}{where} (it is "
                f"checked every {self.check_every_n_steps} steps and at epoch ends). Try a lower "
                "learning rate (model.optimizer.lr), gradient clipping "
                "(trainer.gradient_clip_val=1.0), or bf16-mixed / 32-true precision instead of "
                "16-mixed."
            )
