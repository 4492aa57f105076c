"""Checkpoint files written whole (`AtomicCheckpointIO`, the Trainer's writer) and read safely,
from a path or a URL."""

import contextlib
import re
from pathlib import Path
from typing import Any

import fsspec
import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.plugins import TorchCheckpointIO

from kindling.errors import UserError
from kindling.files import write_atomically


class AtomicCheckpointIO(TorchCheckpointIO):
    """Each local checkpoint written with `write_atomically`: a process killed while writing
    leaves the previous `last.ckpt` whole (Lightning's writer stages it in /tmp and moves it: a
    copy across file systems). Object-store URLs go to Lightning's writer: one upload, which the
    store makes visible whole."""

    def save_checkpoint(
        self, checkpoint: dict, path: str | Path, storage_options: Any = None
    ) -> None:
        fs, local_path = fsspec.core.url_to_fs(str(path))
        if storage_options is not None or not isinstance(fs, LocalFileSystem):
            return super().save_checkpoint(checkpoint, path, storage_options)
        write_atomically(Path(local_path), lambda file: torch.save(checkpoint, file), durable=True)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """`torch.load(weights_only=True)` a checkpoint onto the CPU, from a file or an fsspec URL
    (its package, such as s3fs, installed), with one-line errors that name the intact checkpoints
    beside a damaged one."""
    try:
        fs, inner = fsspec.core.url_to_fs(str(path))
    except (ImportError, ValueError) as error:  # a protocol without its package, or unknown
        raise UserError(f"Cannot read {path}: {error}. Check ckpt_path.") from None
    local = isinstance(fs, LocalFileSystem)
    if not fs.isfile(inner):
        raise UserError(f"Checkpoint {path} does not exist. Check ckpt_path.")
    if local and fs.size(inner) == 0:
        raise UserError(f"{path} is empty (0 bytes).{intact_beside(Path(inner))}")
    try:
        with contextlib.nullcontext(inner) if local else fs.open(inner, "rb") as source:
            checkpoint = _load(source)
    except Exception as error:
        beside = intact_beside(Path(inner)) if local else " Check ckpt_path."
        raise UserError(f"{path} is not a readable checkpoint ({error}).{beside}") from error
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise UserError(f"{path} is not a Lightning checkpoint (no state_dict). Check ckpt_path.")
    return checkpoint


def _load(source: Any) -> Any:
    # mmap: checking a large local checkpoint reads next to nothing.
    mmap = isinstance(source, str | Path) or None
    return torch.load(source, map_location="cpu", weights_only=True, mmap=mmap)


def intact_beside(path: Path) -> str:
    """The end of the error about a refused local `path`: the readable checkpoints beside it,
    newest first, to pass instead."""
    others = sorted(path.parent.glob("*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True)
    names = [other.name for other in others if other != path and _readable(other)]
    if not names:
        return " Check ckpt_path."
    return (
        f" Intact checkpoints beside it, newest first: {', '.join(names)}: "
        f"pass one as ckpt_path={path.parent}/<name>."
    )


def _readable(path: Path) -> bool:
    try:
        return isinstance(_load(path), dict)
    except Exception:
        return False


def without_compile_prefix(state_dict: dict[str, Any]) -> dict[str, Any]:
    """Drop the `_orig_mod.` a `torch.compile` wrapper puts into parameter names, so a compiled
    net's weights load into a plain one."""
    return {re.sub(r"(^|\.)_orig_mod\.", r"\1", key): value for key, value in state_dict.items()}
