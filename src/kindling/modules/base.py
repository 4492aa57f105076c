"""What kindling's LightningModules share: epoch metrics, a compiled net, and the optimizer and
scheduler from the `_partial_` factories of the model config (kindling.modules.optimization)."""

import math
from collections.abc import Callable, Iterable
from typing import Any, Literal

import lightning as L
import torch
from torch import nn
from torchmetrics import MeanMetric, Metric

from kindling.errors import UserError
from kindling.modules.optimization import takes_total_steps

STAGES = ("train", "val", "test")


class BaseModule(L.LightningModule):
    """Logs `<stage>/loss` (the mean over the epoch's samples) and `<stage>/<name>` of each of
    `metrics`. Subclasses give a `net` and `shared_step(stage, batch)`: it updates the stage's
    metrics and returns `{"loss": mean, ...}`. Steps only `update()` the metrics, logged once an
    epoch: logging a metric object each step costs more than a small model's step
    (step_floor.py). `compile`: `torch.compile` the net before fitting (`compile_mode`).
    A subclass passes these arguments on with `**kwargs`."""

    def __init__(
        self,
        optimizer: Callable[..., torch.optim.Optimizer],
        scheduler: Callable[..., torch.optim.lr_scheduler.LRScheduler] | None = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        compile: bool = False,
        compile_mode: str | None = None,
        metrics: dict[str, Callable[[], Metric]] | None = None,
    ):
        super().__init__()
        # The subclass's arguments too. Only plain values go into checkpoints; the net,
        # optimizer and scheduler come from config.
        ignore = ["net", "optimizer", "scheduler", "metrics"]
        self.save_hyperparameters(ignore=ignore, logger=False)
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        # The default NaN check reads `isnan(x).any()` on the host: a device sync per step. A NaN
        # loss shows as a NaN epoch mean instead (StopOnDivergence stops the run). Without it,
        # `update`'s `weight` is ignored (torchmetrics#3434): update with per-sample values.
        makers = {"loss": lambda: MeanMetric(nan_strategy="disable"), **(metrics or {})}
        self.epoch_metrics = nn.ModuleDict(
            {f"{stage}/{name}": make() for stage in STAGES for name, make in makers.items()}
        )

    def configure_model(self) -> None:
        # In place: the state_dict keys stay the same, so checkpoints load compiled or not.
        if self.hparams.compile and self.trainer.state.fn == "fit":
            self.net.compile(mode=self.hparams.compile_mode)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.shared_step("train", batch)["loss"]

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        return self.shared_step("val", batch)

    def test_step(self, batch: Any, batch_idx: int) -> dict[str, torch.Tensor]:
        return self.shared_step("test", batch)

    def log_epoch(self, stage: str, prog_bar: bool = True) -> None:
        for name, metric in self.epoch_metrics.items():
            if name.startswith(f"{stage}/"):
                self.log(name, metric, prog_bar=prog_bar)

    def on_train_epoch_end(self) -> None:
        self.log_epoch("train")

    def on_validation_epoch_end(self) -> None:
        self.log_epoch("val")

    def on_test_epoch_end(self) -> None:
        self.log_epoch("test", prog_bar=False)

    def configure_optimizers(self, params: Iterable | None = None) -> dict[str, Any]:
        """The optimizer over `params` (default: those the strategy trains) or parameter groups,
        a group's `lr_ratio` scaling its learning rate; and the scheduler, stepped every
        `scheduler_interval` (val/loss feeds ReduceLROnPlateau). A scheduler factory with a free
        `total_steps` gets the run's optimizer steps."""
        optimizer = self.optimizer_factory(params=params or self.trainer.model.parameters())
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * group.get("lr_ratio", 1.0)  # before a scheduler reads it
        if self.scheduler_factory is None:
            return {"optimizer": optimizer}
        interval = self.hparams.scheduler_interval
        run_length = {}
        if takes_total_steps(self.scheduler_factory):
            if interval != "step":
                raise UserError(
                    f"model.scheduler counts optimizer steps (total_steps), but "
                    f"model.scheduler_interval={interval} steps it once per epoch. Set "
                    "model.scheduler_interval=step."
                )
            # As the Trainer counts them: max_steps or max_epochs, train batches, accumulation.
            total = self.trainer.estimated_stepping_batches
            if not math.isfinite(total) or total < 1:
                raise UserError(
                    f"The learning-rate schedule (model.scheduler) needs the run's length, and "
                    f"this run has none (trainer.max_steps={self.trainer.max_steps}, "
                    f"trainer.max_epochs={self.trainer.max_epochs}). Set trainer.max_steps=<steps> "
                    "or trainer.max_epochs=<epochs>, or train without a schedule: "
                    "model.scheduler=null."
                )
            run_length = {"total_steps": int(total)}
        scheduler = self.scheduler_factory(optimizer=optimizer, **run_length)
        entry = {"scheduler": scheduler, "interval": interval, "monitor": "val/loss"}
        return {"optimizer": optimizer, "lr_scheduler": entry}
