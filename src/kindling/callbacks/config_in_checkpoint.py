"""Store the run's resolved config in every checkpoint, so a checkpoint alone rebuilds its model."""

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback


class ConfigInCheckpoint(Callback):
    """Saves `config` as `checkpoint["config"]`: plain containers, which `weights_only` loads."""

    def __init__(self, config: dict[str, Any]):
        self.config = config

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        checkpoint["config"] = self.config
