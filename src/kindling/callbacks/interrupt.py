"""Save a resumable checkpoint when a run is stopped by SIGTERM (clusters) or Ctrl-C."""

from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException


class CheckpointOnInterrupt(Callback):
    """On SIGTERM or Ctrl-C during fit, write `last.ckpt` next to the other checkpoints.

    Lightning stops at the end of the current step on SIGTERM (and between steps on Ctrl-C)
    and calls `on_exception`; the checkpoint holds the loop state, so `ckpt_path=<it>` resumes
    mid-epoch. `saved_path` tells the caller where it went.
    """

    def __init__(self, filename: str = "last.ckpt"):
        self.filename = filename
        self.saved_path: Path | None = None

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        if not isinstance(exception, SIGTERMException | KeyboardInterrupt):
            return
        # Also during the validation inside fit: Lightning stops there too on SIGTERM.
        if trainer.state.fn != TrainerFn.FITTING:
            return
        checkpoint_dir = getattr(trainer.checkpoint_callback, "dirpath", None)
        folder = Path(checkpoint_dir or Path(trainer.default_root_dir) / "checkpoints")
        self.saved_path = folder / self.filename
        trainer.save_checkpoint(self.saved_path)
        rank_zero_info(
            f"Interrupted at epoch {trainer.current_epoch}, step {trainer.global_step}. "
            f"Checkpoint: {self.saved_path}\n"
            f"Resume with: python train.py ckpt_path={self.saved_path}"
        )
