"""Build the objects of a config group that maps names to objects (callbacks, loggers)."""

from typing import Any

from hydra.utils import instantiate
from omegaconf import DictConfig


def instantiate_group(group: DictConfig | None) -> list[Any]:
    """Instantiate every entry of `{name: {_target_: ...}}`; entries set to null are skipped.

    A user turns one entry off with `callbacks.early_stopping=null`.
    """
    if not group:
        return []
    return [instantiate(entry) for entry in group.values() if entry is not None]
