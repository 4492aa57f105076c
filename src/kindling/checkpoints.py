"""Checkpoint files: read safely from a path or a URL, written atomically."""

import re
from pathlib import Path
from typing import Any

import fsspec
import torch
from fsspec.implementations.local import LocalFileSystem
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
    if local and Path(inner).stat().st_size == 0:
        raise UserError(f"{path} is empty (0 bytes).{intact_beside(Path(inner))}")
    try:
        if local:
            checkpoint = _load_local(Path(inner))
        else:
            with fs.open(inner, "rb") as file:
                checkpoint = torch.load(file, map_location="cpu", weights_only=True)
    except Exception as error:
        raise UserError(
            f"{path} is not a readable checkpoint ({error}).{intact_beside(Path(inner), local)}"
        ) from error
    if not isinstance(checkpoint, dict) or "state_dict" not in checkpoint:
        raise UserError(f"{path} is not a Lightning checkpoint (no state_dict). Check ckpt_path.")
    return checkpoint


def _load_local(path: Path) -> Any:
    # mmap: reading a large checkpoint to check it costs next to nothing.
    return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


def intact_beside(path: Path, local: bool = True) -> str:
    """The end of the error about `path`: the readable checkpoints in its folder, newest first,
    to pass instead. Reached only when `path` is refused."""
    others = (
        []
        if not local
        else sorted(
            (other for other in path.parent.glob("*.ckpt") if other != path),
            key=lambda other: other.stat().st_mtime,
            reverse=True,
        )
    )
    names = [other.name for other in others if _readable(other)]
    if not names:
        return " Check ckpt_path."
    return (
        f" Intact checkpoints beside it, newest first: {', '.join(names)}: "
        f"pass one as ckpt_path={path.parent}/<name>."
    )


def _readable(path: Path) -> bool:
    try:
        return isinstance(_load_local(path), dict)
    except Exception:
        return False


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
