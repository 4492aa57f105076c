"""What kindling's LightningModules share: epoch metrics, and the optimizer and scheduler from
the `_partial_` factories of the model config (kindling.modules.optimization)."""

from collections.abc import Callable, Iterable
from typing import Any, Literal

import lightning as L
import torch
from torch import nn
from torchmetrics import MeanMetric, Metric

OptimizerFactory = Callable[..., torch.optim.Optimizer]
SchedulerFactory = Callable[..., torch.optim.lr_scheduler.LRScheduler]
STAGES = ("train", "val", "test")


class BaseModule(L.LightningModule):
    """Logs `<stage>/loss` (the mean over the epoch's samples) and `<stage>/<name>` of each of
    `metrics`. Subclasses give `shared_step(stage, batch)`: it updates the stage's metrics and
    returns `{"loss": mean, ...}`. Steps only `update()` the metrics, logged once an epoch:
    logging a metric object each step costs more than a small model's step (step_floor.py)."""

    def __init__(
        self,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None,
        scheduler_interval: Literal["epoch", "step"],
        metrics: dict[str, Callable[[], Metric]] | None = None,
    ):
        super().__init__()
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler
        # The default NaN check reads `isnan(x).any()` on the host: a device sync per step. A NaN
        # loss shows as a NaN epoch mean instead (StopOnDivergence stops the run). Without it,
        # `update`'s `weight` is ignored (torchmetrics#3434): update with per-sample values.
        makers = {"loss": lambda: MeanMetric(nan_strategy="disable"), **(metrics or {})}
        self.epoch_metrics = nn.ModuleDict(
            {f"{stage}/{name}": make() for stage in STAGES for name, make in makers.items()}
        )

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
        a group's `lr_ratio` scaling its learning rate; and the scheduler."""
        optimizer = self.optimizer_factory(params=params or self.trainer.model.parameters())
        for group in optimizer.param_groups:
            group["lr"] = group["lr"] * group.get("lr_ratio", 1.0)  # before a scheduler reads it
        if self.scheduler_factory is None:
            return {"optimizer": optimizer}
        from kindling.modules.optimization import lr_scheduler

        interval = self.hparams.scheduler_interval
        scheduler = lr_scheduler(self.scheduler_factory, optimizer, self.trainer, interval)
        return {"optimizer": optimizer, "lr_scheduler": scheduler}
