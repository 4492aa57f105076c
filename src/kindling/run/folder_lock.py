"""One run folder, one writer: two resumes of one run would interleave their epochs in
metrics.csv. Global rank 0 holds `flock` on `<run folder>/.lock`, which the system releases
however the process ends, and writes its name there for the refusal. Where the file system has
no locks, and on Windows, runs go unlocked."""

import errno
import logging
import os
import shlex
import socket
import sys
from pathlib import Path

from lightning.pytorch.utilities import rank_zero_only

from kindling.config.errors import UserError
from kindling.run.run_folder import claim

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

log = logging.getLogger(__name__)

LOCK_FILE = ".lock"
_held: dict[Path, int] = {}  # the lock's file descriptor of each folder this process holds


def hold(folder: str | Path) -> None:
    """Claim `folder` (a SLURM run's) and lock it until `release`; refuse one a live run holds."""
    claim(folder)
    folder = Path(folder).resolve()
    # Global rank 0: the launching process, or rank 0 of torchrun or srun (NODE_RANK: the first
    # process of each node of a Lightning launch over several).
    launching = rank_zero_only.rank == 0 and os.environ.get("NODE_RANK", "0") == "0"
    if fcntl is None or folder in _held or not launching:
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
