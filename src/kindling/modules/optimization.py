"""Optimizer and scheduler from the `_partial_` factories a model config gives a module."""

from collections.abc import Callable, Iterable
from typing import Any

import torch

OptimizerFactory = Callable[..., torch.optim.Optimizer]
SchedulerFactory = Callable[..., torch.optim.lr_scheduler.LRScheduler]


def configure_optimizers(
    optimizer_factory: OptimizerFactory,
    scheduler_factory: SchedulerFactory | None,
    params: Iterable[torch.nn.Parameter],
    interval: str = "epoch",
    monitor: str = "val/loss",
) -> dict[str, Any]:
    """What `LightningModule.configure_optimizers` returns: the optimizer over `params` and,
    if there is one, its scheduler stepped every `interval` (`monitor` feeds ReduceLROnPlateau)."""
    optimizer = optimizer_factory(params=params)
    if scheduler_factory is None:
        return {"optimizer": optimizer}
    scheduler = scheduler_factory(optimizer=optimizer)
    return {
        "optimizer": optimizer,
        "lr_scheduler": {"scheduler": scheduler, "interval": interval, "monitor": monitor},
    }
