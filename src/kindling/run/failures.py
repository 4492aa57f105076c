"""A run that a part of the machine ended, not its config: a full disk, a process of a
multi-process run that died. Each becomes one line that names what failed and how to go on (the
newest intact checkpoint and the command that resumes from it), instead of the library's
traceback, which HYDRA_FULL_ERROR=1 still shows."""

import contextlib
import errno
import logging
import shlex
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import lightning as L

from kindling import errors
from kindling.errors import UserError
from kindling.run import LAST_CHECKPOINT

# Where Lightning's watchdog over the ranks it started logs (its private `_ChildProcessObserver`,
# https://github.com/Lightning-AI/pytorch-lightning/pull/18218): its logger's name and notice are
# what kindling reads, no private attribute; the long-step case of tests/test_failures.py fails
# if either changes.
WATCHDOG_LOGGER = "lightning.fabric.strategies.launchers.subprocess_script"
# What the collectives of a process whose peer died raise (gloo's transport on the CPU, NCCL's
# and the TCP store's on GPUs).
PEER_LOST = (
    "Connection reset by peer", "Connection closed by peer", "Broken pipe", "Socket closed",
    "remote process exited", "NCCL communicator was aborted", "Connection refused",
)  # fmt: skip


class PartFailed(UserError):
    """Each process says what it saw (one saw its peer die, another ran out of disk)."""

    raised_on_every_rank = False

    def __init__(self, text: str, rank: int) -> None:
        super().__init__(text)
        self.rank = rank


def explain(error: BaseException, trainer: L.Trainer, run_dir: str) -> PartFailed | None:
    """The one line for `error` where a full disk or a lost process caused it; None otherwise.
    Called before the ranks this process started are stopped: their state tells which died."""
    chain = list(errors.chain(error))
    full = next((e for e in chain if isinstance(e, OSError) and e.errno == errno.ENOSPC), None)
    if full is not None:
        place = Path(full.filename).parent if full.filename else Path(run_dir)
        free = _megabytes(shutil.disk_usage(place if place.exists() else run_dir).free)
        what = (
            f"No space left on the device of {place} ({free} free); no checkpoint is half-written."
        )
        how_on = resume_line(run_dir, "Make room or move the run folder")
        return PartFailed(f"{what}{how_on}", trainer.global_rank)
    if trainer.world_size > 1 and any(p in str(e) for e in chain for p in PEER_LOST):
        return PartFailed(_rank_lost(trainer, run_dir), trainer.global_rank)
    return None


@contextlib.contextmanager
def said_when_lightning_ends_the_run(trainer: L.Trainer, run_dir: str) -> Iterator[None]:
    """Lightning's watchdog over the ranks it started checks them every 5 s and, finding one
    ended, logs it and kills this process at once: where that comes before this process meets
    the lost rank in a collective (a long step), its record becomes kindling's line."""
    watchdog = logging.getLogger(WATCHDOG_LOGGER)

    def say(record: logging.LogRecord) -> bool:
        if "terminated with code" in record.getMessage():
            record.msg, record.args = _rank_lost(trainer, run_dir), ()
            record.levelno, record.levelname = logging.ERROR, "ERROR"
        return True

    watchdog.addFilter(say)
    try:
        yield
    finally:
        watchdog.removeFilter(say)


def _rank_lost(trainer: L.Trainer, run_dir: str) -> str:
    return (
        f"{_who_ended(trainer)}: rank {trainer.global_rank} stopped with it.{resume_line(run_dir)}"
    )


def resume_line(run_dir: str, first: str = "") -> str:
    """` The newest intact checkpoint: ... Resume with: python train.py ckpt_path=...`, where the
    run has one (checkpoints are written whole: one that exists is intact)."""
    last = Path(run_dir) / LAST_CHECKPOINT
    if not last.is_file():
        return f" {first}." if first else " No checkpoint was written: start it again."
    then = f"{first}, then resume" if first else "Resume"
    command = shlex.quote(f"ckpt_path={last}")
    size = _megabytes(last.stat().st_size)
    return (
        f" The newest intact checkpoint is {last} ({size}). {then} with: python train.py {command}"
    )


def _who_ended(trainer: L.Trainer) -> str:
    """Which rank ended and how, where this process started it; else that one did."""
    children = getattr(trainer.strategy.launcher, "procs", [])  # the ranks Lightning started
    for rank, child in enumerate(children, start=1):
        code = child.poll()
        if code is not None and code != 0:
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
            return f"Rank {rank} of this {trainer.world_size}-process run ended ({how})"
    return f"Another rank of this {trainer.world_size}-process run ended (its connection closed)"


def keep_in_log(error: PartFailed, run_dir: str) -> None:
    """A rank other than 0 has no train.log of its own (rank 0 writes it, and may be the one
    that died): its line is added there."""
    with contextlib.suppress(OSError), open(Path(run_dir) / "train.log", "a") as log:
        log.write(f"[rank {error.rank}] {error}\n")  # a full disk takes no line: suppressed


def _megabytes(size: int) -> str:
    return f"{size / 1e6:.1f} MB"
