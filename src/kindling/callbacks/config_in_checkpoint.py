"""Store the run's resolved config and provenance in every checkpoint, so a checkpoint alone
rebuilds its model and says what produced it."""

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback


class ConfigInCheckpoint(Callback):
    """Saves `config` as `checkpoint["config"]` and `provenance` (command line, git commit and
    diff, versions: `kindling.run.provenance`) as `checkpoint["provenance"]`: plain containers,
    which `weights_only` loads."""

    def __init__(
        self, config: dict[str, Any] | None = None, provenance: dict[str, Any] | None = None
    ):
        self.config = config
        self.provenance = provenance

    def on_save_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if self.config is not None:
            checkpoint["config"] = self.config
        if self.provenance is not None:
            checkpoint["provenance"] = self.provenance
