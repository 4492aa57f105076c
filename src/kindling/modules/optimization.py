"""Learning-rate schedules, and the scheduler from the `_partial_` factory a model config gives.

A scheduler factory with a `total_steps` argument (`warmup_cosine` below, torch's `OneCycleLR`)
gets the run's length in optimizer steps from the Trainer, so the schedule ends where the run
does whether it is counted in epochs or in steps. Any other torch scheduler gets the optimizer
alone (`ReduceLROnPlateau`, `StepLR`, ...).
"""

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import lightning as L
import torch
from torch.optim.lr_scheduler import LambdaLR, LRScheduler

from kindling.config.errors import UserError


def warmup_cosine(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    warmup_ratio: float = 0.0,
    min_lr_ratio: float = 0.0,
) -> LambdaLR:
    """The learning rate rises linearly over the first `warmup_ratio` of the `total_steps`,
    then follows half a cosine down to `min_lr_ratio` times its peak at the last step, as
    nanoGPT's `get_lr` (its 100 warmup steps of 2,000 are `warmup_ratio=0.05`).

    Step `s` of `w` warmup steps trains at `lr * (s + 1) / (w + 1)`. The peak is each parameter
    group's `lr`, so the floor follows `model.optimizer.lr` when it changes. A share rather
    than a count of warmup steps fits runs of any length, down to `debug=fdr`'s one step.
    """
    if not (0.0 <= warmup_ratio < 1.0 and 0.0 <= min_lr_ratio <= 1.0):
        raise UserError(
            f"model.scheduler.warmup_ratio={warmup_ratio} must be in [0, 1) and "
            f"model.scheduler.min_lr_ratio={min_lr_ratio} in [0, 1]: shares of the run and of "
            "the peak learning rate."
        )
    # A partial of a module-level function: LambdaLR saves none of it in checkpoints (only the
    # step count), so a resumed run rebuilds the same curve from its config.
    factor = functools.partial(
        _warmup_cosine_factor,
        total_steps=total_steps,
        warmup_steps=min(round(warmup_ratio * total_steps), total_steps - 1),
        min_lr_ratio=min_lr_ratio,
    )
    return LambdaLR(optimizer, factor)


def _warmup_cosine_factor(
    step: int, total_steps: int, warmup_steps: int, min_lr_ratio: float
) -> float:
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def takes_total_steps(factory: Callable[..., Any]) -> bool:
    """Whether `factory` has a `total_steps` argument that the config left for the module."""
    parameter = inspect.signature(factory).parameters.get("total_steps")
    return parameter is not None and parameter.default in (inspect.Parameter.empty, None)


def total_optimizer_steps(trainer: L.Trainer) -> int:
    """The optimizer steps of the whole run, as the Trainer counts them (max_steps or
    max_epochs, with limit_train_batches, accumulate_grad_batches and the devices)."""
    total = trainer.estimated_stepping_batches
    if not math.isfinite(total) or total < 1:
        raise UserError(
            f"The learning-rate schedule (model.scheduler) needs the run's length, and this run "
            f"has none (trainer.max_steps={trainer.max_steps}, "
            f"trainer.max_epochs={trainer.max_epochs}). Set trainer.max_steps=<steps> or "
            "trainer.max_epochs=<epochs>, or train without a schedule: model.scheduler=null."
        )
    return int(total)


def lr_scheduler(
    factory: Callable[..., LRScheduler],
    optimizer: torch.optim.Optimizer,
    trainer: L.Trainer,
    interval: str,
) -> dict[str, Any]:
    """Lightning's `lr_scheduler` entry: `factory`'s scheduler stepped every `interval`
    (val/loss feeds ReduceLROnPlateau)."""
    if not takes_total_steps(factory):
        scheduler = factory(optimizer=optimizer)
    elif interval != "step":
        raise UserError(
            f"model.scheduler counts optimizer steps (total_steps), but "
            f"model.scheduler_interval={interval} steps it once per epoch. Set "
            "model.scheduler_interval=step."
        )
    else:
        scheduler = factory(optimizer=optimizer, total_steps=total_optimizer_steps(trainer))
    return {"scheduler": scheduler, "interval": interval, "monitor": "val/loss"}
