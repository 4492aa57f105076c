"""A trained module rebuilt from its checkpoint alone: the stored config, checked to build only
what kindling's configs could name, and the weights."""

from pathlib import Path
from typing import Any

import lightning as L
from hydra.utils import get_object, instantiate

from kindling.checkpoints import read_checkpoint, without_compile_prefix
from kindling.errors import UserError


def load_module(
    path: str | Path, kind: type = L.LightningModule, use_instead: str = ""
) -> tuple[L.LightningModule, dict[str, Any]]:
    """The LightningModule of a kindling checkpoint, in eval mode, on the CPU, and the checkpoint
    (its `"config"` is the run's resolved config). A module not of `kind` is refused in one line
    that ends with `use_instead`."""
    checkpoint = read_checkpoint(path)
    if "config" not in checkpoint:
        raise UserError(f"{path} has no stored config: it was not written by kindling's train.py.")
    config = checkpoint["config"]  # its model and data: what predict, sample and export build
    check_stored_config({"model": config.get("model"), "data": config.get("data")}, path)
    # The net built from scratch (`model=timm`: not `pretrained`, no `pretrained_file`): the
    # checkpoint's weights replace any pretrained ones, so loading needs neither the network nor
    # the file training started from.
    model, net = config["model"], config["model"].get("net")
    if isinstance(net, dict):
        off = {"pretrained": False, "pretrained_file": None}
        model = {**model, "net": {**net, **{k: v for k, v in off.items() if k in net}}}
    module = instantiate(model, _convert_="all")
    if not isinstance(module, kind):
        name = type(module).__name__
        raise UserError(f"{path} holds a {name}, not a {kind.__name__}: {use_instead}")
    module.load_state_dict(without_compile_prefix(checkpoint["state_dict"]))
    return module.eval(), checkpoint


# What a checkpoint's stored config may build: kindling's models, modules and data, and the
# libraries its model and data configs name. `weights_only` keeps code out of the file, but a
# config of plain strings can still name any callable (`builtins.open` with mode "w"), and
# people load checkpoints they downloaded.
STORED_TARGET_PACKAGES = (
    "kindling.models.", "kindling.modules.", "kindling.data.", "torch.nn.", "torch.optim.",
    "torchvision.models.", "torchvision.transforms.", "torchmetrics.", "timm.",
)  # fmt: skip
# Functions among them that build things (everything else must be a class).
STORED_FUNCTION_PACKAGES = ("kindling.modules.optimization.", "torchvision.models.", "timm.")


def check_stored_config(node: Any, path: str | Path, key: str = "config") -> None:
    """Refuse, with one line, a stored config that builds anything outside
    `STORED_TARGET_PACKAGES` or holds an interpolation (a stored config is resolved)."""
    refused = f"{path} is refused: its stored config"
    if isinstance(node, dict):
        target = node.get("_target_")
        if target is not None and not _buildable_from_checkpoint(target):
            raise UserError(
                f"{refused} names {key}._target_={target!r}, which no kindling config builds. "
                "Load only checkpoints you trust."
            )
        for name, value in node.items():
            check_stored_config(value, path, f"{key}.{name}")
    elif isinstance(node, list | tuple):
        for index, value in enumerate(node):
            check_stored_config(value, path, f"{key}[{index}]")
    elif isinstance(node, str) and "${" in node:
        raise UserError(f"{refused} has an interpolation at {key}: {node!r}.")


def _buildable_from_checkpoint(target: Any) -> bool:
    if not isinstance(target, str) or not target.startswith(STORED_TARGET_PACKAGES):
        return False
    try:
        found = get_object(target)  # imports only within the packages above
    except Exception:
        return False
    # Defined there too: a name also reaches what those modules import (`timm.models.x.os.system`).
    defined_in = f"{getattr(found, '__module__', None)}."
    if isinstance(found, type):
        return defined_in.startswith(STORED_TARGET_PACKAGES)
    return defined_in.startswith(STORED_FUNCTION_PACKAGES)


def data_state(
    checkpoint: dict[str, Any], path: str | Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The checkpoint's data config and its data module's state (the training set's statistics,
    per channel or per feature); a checkpoint without statistics is refused."""
    data_cfg = checkpoint["config"]["data"]
    state = checkpoint.get(data_cfg["_target_"].rsplit(".", 1)[-1], {})
    if state.get("mean") is None:
        what = "feature" if "features" in state else "image"
        raise UserError(f"{path} has no {what} statistics: retrain with this version.")
    return data_cfg, state
