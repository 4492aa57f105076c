"""Files that readers only ever see whole: any file, and the Trainer's checkpoints."""

import os
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import fsspec
import torch
from fsspec.implementations.local import LocalFileSystem
from lightning.fabric.plugins import TorchCheckpointIO


def write_atomically(path: Path, write: Callable[[BinaryIO], None], durable: bool = False) -> None:
    """Call `write(file)` on a new file beside `path`, then rename it to `path`: readers see the
    old file or the new one, never half of one. The partial file's name is unique, so processes
    (of several nodes too) can write one path at once: the last rename wins. `durable` syncs the
    data to disk before the rename, so a crash right after it cannot leave `path` empty."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(partial, "xb") as file:
            write(file)
            if durable:
                file.flush()
                os.fsync(file.fileno())
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def probe_writable(folder: Path) -> None:
    """Raise OSError unless `folder` takes a new file: a real one, as os.access says yes to root
    on read-only file systems and in /proc."""
    with tempfile.TemporaryFile(dir=folder):
        pass


def is_url(path: str | Path) -> bool:
    """Whether `path` is in object storage (`s3://`, `gs://`, `memory://`; `file://` is local)."""
    return fsspec.utils.get_protocol(str(path)) not in ("file", "local")


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
