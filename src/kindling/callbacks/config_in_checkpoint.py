"""The run's resolved config and provenance in every checkpoint: a checkpoint alone rebuilds its
model and says what produced it."""

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback


class ConfigInCheckpoint(Callback):
    """`checkpoint["config"]` and `checkpoint["provenance"]` (`kindling.run.provenance`), plain
    containers that `weights_only` loads; `kindling.train` sets both."""

    def __init__(self, config: dict | None = None, provenance: dict | None = None):
        self.config, self.provenance = config, provenance

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: Any, checkpoint: dict) -> None:
        for key in ("config", "provenance"):
            if getattr(self, key) is not None:
                checkpoint[key] = getattr(self, key)
