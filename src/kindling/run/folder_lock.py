"""One run folder, one writer: a run holds a lock on its folder while it runs.

Two processes writing one folder (two resumes of the same run started together, or a run
trained into the folder of a live one) would interleave their epochs in metrics.csv and version
each other's checkpoints. The lock is `flock` on `<run folder>/.lock`, which the operating system
releases when the process ends, however it ends: a killed run never leaves a stale lock. The file
names its holder (process id, host, command), for the refusal to name. Only the launching
process (global rank 0) takes it: the other ranks of its job share the folder. Where the file
system has no locks, and on Windows, runs go unlocked.
"""

import errno
import logging
import os
import shlex
import socket
import sys
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_only

from kindling.config.errors import UserError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
# The lock's file descriptor of each folder this process holds.
_held: dict[Path, int] = {}


def hold(folder: str | Path) -> None:
    """Lock `folder` for this process until `release`; refuse if a live process holds it."""
    folder = Path(folder).resolve()
    if fcntl is None or folder in _held or not _launching_process():
        return
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        holder = os.pread(fd, 4096, 0).decode(errors="replace").strip()
        os.close(fd)
        if error.errno in (errno.EAGAIN, errno.EACCES):
            raise UserError(
                f"{folder} is in use by {holder or 'another process'}: one run folder has one "
                "writer. Wait for that run to end, or stop it; resume_in_new_folder=true goes on "
                "from the same checkpoint in a new folder."
            ) from None
        log.warning("Runs in %s go unlocked: its file system refused a lock (%s).", folder, error)
        return
    os.ftruncate(fd, 0)
    command = shlex.join([os.path.basename(sys.executable), *sys.argv])
    os.write(fd, f"process {os.getpid()} on {socket.gethostname()} ({command})".encode())
    _held[folder] = fd


def release(folder: str | Path) -> None:
    """Let the next run write `folder` (a multirun's next job runs in the same process)."""
    fd = _held.pop(Path(folder).resolve(), None)
    if fd is not None:
        os.close(fd)  # closing the file releases its lock


def _launching_process() -> bool:
    """Global rank 0: the process that launched the job, or rank 0 of torchrun or srun. (A
    Lightning launch over several nodes gives each node's first process NODE_RANK.)"""
    return rank_zero_only.rank == 0 and os.environ.get("NODE_RANK", "0") == "0"
