"""Files that readers only ever see whole (the Trainer's checkpoints among them:
`kindling.checkpoints`), written locally or to object storage."""

import os
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO

import fsspec
import yaml


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


def write_yaml(path: Path, record: dict[str, Any]) -> None:
    """`record` as YAML in `path`, written whole (`write_atomically`), its keys in their order."""
    text = yaml.safe_dump(record, sort_keys=False, width=float("inf"))
    write_atomically(path, lambda file: file.write(text.encode()))


def probe_writable(folder: Path) -> None:
    """Raise OSError unless `folder` takes a new file: a real one, as os.access says yes to root
    on read-only file systems and in /proc."""
    with tempfile.TemporaryFile(dir=folder):
        pass


def is_url(path: str | Path) -> bool:
    """Whether `path` is in object storage (`s3://`, `gs://`, `memory://`; `file://` is local)."""
    return fsspec.utils.get_protocol(str(path)) not in ("file", "local")
