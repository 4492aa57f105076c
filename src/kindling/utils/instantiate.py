"""Build objects from config, turning a bad value into a message that names its key."""

from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig

from kindling.utils.errors import UserError, find_user_error


def build(node: DictConfig, key: str, **kwargs: Any) -> Any:
    """`instantiate(node)` with plain containers; a TypeError or ValueError from the constructor
    (`model.optimizer.lr=abc`) becomes a UserError naming `key` and the values set under it.

    `_convert_="all"`: objects get plain lists and dicts, never OmegaConf containers, so what
    they save into checkpoints loads with `torch.load(weights_only=True)`.
    """
    try:
        return instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as error:
        cause = error.__cause__
        if find_user_error(error) is not None or not isinstance(cause, TypeError | ValueError):
            raise
        target = node.get("_target_", "?")
        raise UserError(
            f"Could not build {key} ({target}): {cause}.\n"
            f"Check the values under {key}{_overrides_under(key)}."
        ) from error


def _overrides_under(key: str) -> str:
    """`; you set a.b=x, a.c=y` for the command-line overrides of keys under `key`."""
    if not HydraConfig.initialized():
        return ""
    mine = [o for o in HydraConfig.get().overrides.task if o.lstrip("+~").startswith(f"{key}.")]
    return f"; you set {', '.join(mine)}" if mine else ""


def instantiate_group(group: DictConfig | None, key: str) -> list[Any]:
    """Build every entry of `{name: {_target_: ...}}` (callbacks, loggers); null entries are off.

    A user turns one entry off with `callbacks.early_stopping=null`.
    """
    if not group:
        return []
    return [build(entry, f"{key}.{name}") for name, entry in group.items() if entry is not None]
