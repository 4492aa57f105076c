"""A resumed run's metrics follow the rows its checkpoint covers, in the loggers that keep them."""

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn


class ContinueLoggedMetrics(Callback):
    """When training resumes from a checkpoint, tell each logger that continues a run's record
    (`continue_after`, e.g. `ResumableCSVLogger`) where the checkpoint was saved;
    before a checkpoint is written, have it put every row the checkpoint covers on disk
    (`save_before_checkpoint`).

    Lightning calls this for every way of resuming: `ckpt_path=` and SLURM's requeue alike.
    Loading a checkpoint to test it (the best one, which may be older than the run's last epoch)
    continues nothing. Lightning saves an epoch's checkpoints before it logs the epoch's train
    values: that row is handed to the logger at the save, so a kill between the two loses nothing.
    """

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            return
        for logger in trainer.loggers:
            if hasattr(logger, "continue_after"):
                logger.continue_after(checkpoint["epoch"], checkpoint["global_step"])

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        loggers = [
            logger for logger in trainer.loggers if hasattr(logger, "save_before_checkpoint")
        ]
        if not loggers:
            return
        from kindling.internals import epoch_end_row  # a private part of Lightning

        to_come = epoch_end_row(trainer)  # on every rank: its values may be reduced across them
        for logger in loggers:
            logger.save_before_checkpoint(to_come)
