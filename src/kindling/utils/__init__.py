"""Helpers that Lightning, Hydra and torchmetrics do not already provide."""

from kindling.utils import hydra_ddp
from kindling.utils.errors import UserError
from kindling.utils.instantiate import instantiate_group

__all__ = ["UserError", "hydra_ddp", "instantiate_group"]
