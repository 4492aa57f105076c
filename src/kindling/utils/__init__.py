"""Helpers that Lightning, Hydra and torchmetrics do not already provide."""

from kindling.utils import checks, hydra_ddp, resume
from kindling.utils.errors import UserError
from kindling.utils.instantiate import build, instantiate_group

__all__ = ["UserError", "build", "checks", "hydra_ddp", "instantiate_group", "resume"]
