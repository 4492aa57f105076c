"""Load a kindling checkpoint with nothing but the file: its config rebuilds the module."""

import re
from pathlib import Path
from typing import Any

import fsspec
import lightning as L
import torch
from fsspec.implementations.local import LocalFileSystem
from hydra.utils import get_object, instantiate
from lightning.fabric.plugins import TorchCheckpointIO

from kindling.config.errors import UserError
from kindling.files import write_atomically


def is_url(path: str | Path) -> bool:
    """Whether `path` is in object storage (`s3://`, `gs://`, `memory://`): an fsspec URL of
    another file system than the local one (`file://` is local)."""
    return fsspec.utils.get_protocol(str(path)) not in ("file", "local")


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """`torch.load` a checkpoint safely (`weights_only=True`) onto the CPU, with clear errors.

    `path` is a file, or an fsspec URL (`s3://bucket/run/last.ckpt`; its file system's package,
    such as s3fs or gcsfs, must be installed).
    """
    try:
        fs, inner = fsspec.core.url_to_fs(str(path))
    except (ImportError, ValueError) as error:  # a protocol without its package, or unknown
        raise UserError(f"Cannot read {path}: {error}. Check ckpt_path.") from None
    local = isinstance(fs, LocalFileSystem)
    if not (Path(inner).is_file() if local else fs.isfile(inner)):
        raise UserError(f"Checkpoint {path} does not exist. Check ckpt_path.")
    try:
        if local:
            # mmap: reading a large checkpoint to check it costs next to nothing.
            checkpoint = torch.load(inner, map_location="cpu", weights_only=True, mmap=True)
        else:
            with fs.open(inner, "rb") as file:
                checkpoint = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:
        raise UserError(
            f"{path} is not a readable checkpoint ({error}). Check ckpt_path."
        ) from error
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise UserError(f"{path} is not a Lightning checkpoint (no state_dict). Check ckpt_path.")
    return checkpoint


def load_module(path: str | Path) -> tuple[L.LightningModule, dict[str, Any]]:
    """Rebuild the LightningModule saved in a kindling checkpoint, in eval mode, on the CPU.

    Returns the module and the checkpoint (its `"config"` is the run's resolved config).
    """
    checkpoint = read_checkpoint(path)
    if "config" not in checkpoint:
        raise UserError(f"{path} has no stored config: it was not written by kindling's train.py.")
    config = checkpoint["config"]
    # Model and data: what prediction, sampling and export build from a checkpoint.
    check_stored_config({"model": config.get("model"), "data": config.get("data")}, path)
    module = instantiate(config["model"], _convert_="all")
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


def instantiate_stored(config: Any, path: str | Path, **kwargs: Any) -> Any:
    """`instantiate` a config stored in the checkpoint at `path`, once every `_target_` in it
    is one that kindling's configs could name (checked before anything is imported or called)."""
    check_stored_config(config, path)
    return instantiate(config, _convert_="all", **kwargs)


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
    if not isinstance(target, str) or not re.fullmatch(r"[A-Za-z_][\w.]*", target):
        return False
    if not target.startswith(STORED_TARGET_PACKAGES):
        return False
    try:
        found = get_object(target)  # imports only within the packages above
    except Exception:
        return False
    return isinstance(found, type) or target.startswith(STORED_FUNCTION_PACKAGES)


def without_compile_prefix(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Drop the `_orig_mod.` that a `torch.compile` wrapper puts into parameter names, so weights
    of a compiled net load into a plain one. (kindling compiles in place and adds none.)"""
    return {re.sub(r"(^|\.)_orig_mod\.", r"\1", key): value for key, value in state_dict.items()}


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write each local checkpoint to a new file beside it, then rename it into place.

    A process killed while writing (SIGKILL, out of memory, a node failure) leaves the previous
    `last.ckpt` whole instead of a truncated file that breaks the next resume: a rename within
    a folder is atomic. Lightning's own writer stages the file in the system's temp folder and
    moves it, which is a copy (not atomic) when the checkpoints live on another file system, and
    needs room for the whole checkpoint in `/tmp`. Object-store URLs (`s3://...`) go to
    Lightning's writer: one upload, which the store makes visible whole, so a reader never sees
    half a checkpoint there either.
    """

    def save_checkpoint(
        self, checkpoint: dict[str, Any], path: str | Path, storage_options: Any = None
    ) -> None:
        fs, local_path = fsspec.core.url_to_fs(str(path))
        if storage_options is not None or not isinstance(fs, LocalFileSystem):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        # On disk before the rename makes it last.ckpt.
        write_atomically(Path(local_path), lambda file: torch.save(checkpoint, file), durable=True)
