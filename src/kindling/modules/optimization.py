"""Learning-rate schedules. A scheduler factory with a `total_steps` argument (`warmup_cosine`,
torch's `OneCycleLR`) gets the run's length in optimizer steps from the Trainer, so the schedule
ends where the run does, counted in epochs or in steps; any other gets the optimizer alone."""

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.optim.lr_scheduler import LambdaLR

from kindling.errors import UserError


def warmup_cosine(
    optimizer: torch.optim.Optimizer,
    total_steps: int,
    warmup_ratio: float = 0.0,
    min_lr_ratio: float = 0.0,
) -> LambdaLR:
    """A linear rise over the first `warmup_ratio` of the `total_steps`, then half a cosine down to
    `min_lr_ratio` times each group's `lr` at the last step, as nanoGPT's `get_lr` (its 100
    warmup steps of 2,000: `warmup_ratio=0.05`); a share fits runs of any length."""
    if not (0.0 <= warmup_ratio < 1.0 and 0.0 <= min_lr_ratio <= 1.0):
        raise UserError(
            f"model.scheduler.warmup_ratio={warmup_ratio} must be in [0, 1) and "
            f"model.scheduler.min_lr_ratio={min_lr_ratio} in [0, 1]: shares of the run and of "
            "the peak learning rate."
        )
    # A partial of a module-level function: LambdaLR saves none of it in checkpoints (only the
    # step count), so a resumed run rebuilds the same curve from its config.
    warmup_steps = min(round(warmup_ratio * total_steps), total_steps - 1)
    return LambdaLR(optimizer, functools.partial(_factor, total_steps, warmup_steps, min_lr_ratio))


def _factor(total_steps: int, warmup_steps: int, min_lr_ratio: float, step: int) -> float:
    if step < warmup_steps:
        return (step + 1) / (warmup_steps + 1)
    progress = min(1.0, (step - warmup_steps) / (total_steps - warmup_steps))
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def takes_total_steps(factory: Callable[..., Any]) -> bool:
    """Whether `factory` has a `total_steps` argument that the config left for the module."""
    parameter = inspect.signature(factory).parameters.get("total_steps")
    return parameter is not None and parameter.default in (inspect.Parameter.empty, None)
