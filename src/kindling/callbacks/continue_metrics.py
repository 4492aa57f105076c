"""A resumed run's metrics follow the rows its checkpoint covers, in the loggers that keep them."""

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn


class ContinueLoggedMetrics(Callback):
    """When training resumes (`ckpt_path=` or SLURM's requeue alike), tell each logger that
    continues a record (`continue_after`: `ResumableCSVLogger`) where the checkpoint was saved;
    before each checkpoint, have it put every row the checkpoint covers on disk, including the
    epoch's train row, which Lightning logs only after the checkpoint (internals.py). Loading a
    checkpoint to test it continues nothing."""

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: Any, checkpoint: dict) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            for logger in trainer.loggers:
                if hasattr(logger, "continue_after"):
                    logger.continue_after(checkpoint["epoch"], checkpoint["global_step"])

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: Any, checkpoint: dict) -> None:
        loggers = [lg for lg in trainer.loggers if hasattr(lg, "save_before_checkpoint")]
        if loggers:
            from kindling.internals import epoch_end_row  # a private part of Lightning

            to_come = epoch_end_row(trainer)  # on every rank: its values may be reduced
            for logger in loggers:
                logger.save_before_checkpoint(to_come)
