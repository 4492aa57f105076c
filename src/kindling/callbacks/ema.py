"""An exponential moving average of the weights that validation, test and checkpoints share."""

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import EMAWeightAveraging
from lightning.pytorch.trainer.states import TrainerFn


class EMAWeights(EMAWeightAveraging):
    """Lightning's `EMAWeightAveraging`, whose checkpoints hold the average as `state_dict`,
    tested as it is validated.

    Lightning's callback loads a checkpoint's `current_model_state` (the raw weights) whenever
    it has an average, so `trainer.test(ckpt_path=best)` after `fit` tested the raw weights of
    a checkpoint chosen for its average's `val/acc`. Here only resuming a fit loads the raw
    weights; testing, validating and predicting keep the checkpoint's `state_dict`: the average.
    """

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            super().on_load_checkpoint(trainer, pl_module, checkpoint)
