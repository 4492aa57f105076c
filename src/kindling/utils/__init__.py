"""Helpers that Lightning, Hydra and torchmetrics do not already provide."""

from kindling.utils import checks, hydra_ddp, resume, run_folder
from kindling.utils.errors import UserError
from kindling.utils.instantiate import build, instantiate_group

__all__ = ["UserError", "build", "checks", "hydra_ddp", "instantiate_group", "resume", "run_folder"]
