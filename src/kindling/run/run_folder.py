"""Run folders: one per run, made atomically, shared by all the ranks of one launch.

Runs started in the same instant (a shell loop, a job array, several multiruns) must never share
a folder, so a folder is claimed with `mkdir`, which exactly one process wins: the others take
the next name (`<stamp>-1`, `<stamp>-2`, ...). The ranks of one multi-process launch must all use
the folder their rank 0 claimed:

- Lightning's own DDP launcher passes it to ranks 1..N-1 as `hydra.run.dir=` (`hydra_ddp.py`).
- `torchrun` and `srun` start every rank as a separate `python train.py`: rank 0 claims the folder
  and writes its path into `<log_dir>/.launches/<launch id>`, where the other ranks read it. The
  launch id is made of what the launcher gives every rank of this launch and no other launch
  (`launch_id`), so a file left by an earlier launch never names a later run's folder. A multirun
  shares its sweep folder the same way. Rank 0 removes the file once every rank has joined the
  process group (so has read it: `release_handshakes`), and files a day old when it writes one.
- Under SLURM the folder is named after the job, `slurm-<job id>[_<array task>][.<step>]`, and a
  requeued job (same job, a higher SLURM_RESTART_COUNT, the same command line) takes its folder
  back, with the `hpc_ckpt_*.ckpt` Lightning saved there before the job was stopped. Other runs in
  the same allocation with that name get `-1`, `-2`, ...
"""

import hashlib
import itertools
import os
import shlex
import socket
import sys
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from pathlib import Path

from kindling.files import write_atomically

# Where rank 0 of a torchrun or srun launch leaves the path of its run folder for the other ranks.
LAUNCHES_DIR = ".launches"
# A handshake this old is left by a launch that failed before its ranks met: no rank still waits.
STALE_HANDSHAKE_S = 24 * 3600
# Inside a SLURM run folder: who owns it (command line, and one entry per restart of the job).
SLURM_OWNER_DIR = ".slurm"

# Folders this process claimed, so that resolving the same config key twice claims once.
_claimed: dict[tuple[str, str], Path] = {}
# The handshake files this process (rank 0 of its launch) wrote.
_published: list[Path] = []


def run_stamp() -> str:
    """The date and time to the millisecond: `2026-11-23_14-35-30.123`."""
    now = datetime.now()
    return f"{now:%Y-%m-%d_%H-%M-%S}.{now.microsecond // 1000:03d}"


def claim_folder(parent: Path, name: str) -> Path:
    """Create `parent/name`, or `name-1`, `name-2`, ... if taken: `mkdir` has exactly one winner."""
    parent.mkdir(parents=True, exist_ok=True)
    for n in itertools.count():
        folder = parent / (name if n == 0 else f"{name}-{n}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise AssertionError("unreachable")


def claim_slurm_folder(parent: Path, name: str) -> Path:
    """Like `claim_folder`, but a requeued job takes back the folder of its first start.

    A folder belongs to one command line; each start of the job (SLURM_RESTART_COUNT) claims one
    folder of its command line, the first it has not claimed yet.
    """
    command = shlex.join(sys.argv[1:])
    restart = os.environ.get("SLURM_RESTART_COUNT", "0")
    for n in itertools.count():
        folder = parent / (name if n == 0 else f"{name}-{n}")
        owner = folder / SLURM_OWNER_DIR
        owner.mkdir(parents=True, exist_ok=True)
        if _publish(owner / "command", command) != command:
            continue
        try:
            (owner / f"restart-{restart}").mkdir()
            return folder
        except FileExistsError:  # another run of this command in this start of the job
            continue
    raise AssertionError("unreachable")


def _publish(path: Path, text: str) -> str:
    """Write `text` to `path` unless it exists (atomically, whole); return what `path` holds."""
    partial = path.with_name(f"{path.name}.{uuid.uuid4().hex}")
    partial.write_text(text)
    try:
        os.link(partial, path)  # fails if `path` exists: never half a file, never overwritten
        return text
    except FileExistsError:
        return path.read_text()
    finally:
        partial.unlink()


def slurm_name() -> str | None:
    """`slurm-<job id>[_<array task>][.<step>]` inside a SLURM job, else None."""
    job = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID")
    if job is None:
        return None
    name = f"slurm-{job}"
    if "SLURM_ARRAY_TASK_ID" in os.environ:
        name += f"_{os.environ['SLURM_ARRAY_TASK_ID']}"
    if "SLURM_STEP_ID" in os.environ:  # one folder per `srun` in an allocation
        name += f".{os.environ['SLURM_STEP_ID']}"
    return name


def launch_rank() -> int:
    """This process's rank in its launch: torchrun's RANK, srun's SLURM_PROCID, else 0."""
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return int(os.environ.get("RANK", "0"))
    if slurm_name() is not None:
        return int(os.environ.get("SLURM_PROCID", "0"))
    return 0


def launch_id() -> str | None:
    """What every rank of this launch shares and no other launch has; None for a lone process.

    torchrun gives each rank the run id (`--rdzv-id`: the same, `none`, in every launch unless set;
    a fresh uuid with `--standalone`), the rendezvous address and port (fixed with static
    rendezvous) and the restart count. On one node all ranks are also children of one torchrun
    agent, whose process id sets this launch apart from earlier ones. On several nodes the run id
    must do that: give it the job id, as torchrun's documentation asks (`--rdzv-id=$JOB_ID`).
    Under srun: the job, array task, step and restart count.
    """
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env:
        parts = [
            "torchrun",
            env["TORCHELASTIC_RUN_ID"],
            env.get("MASTER_ADDR", ""),
            env.get("MASTER_PORT", ""),
            env.get("TORCHELASTIC_RESTART_COUNT", "0"),
        ]
        if env.get("GROUP_WORLD_SIZE", "1") == "1":
            parts += [socket.gethostname(), str(os.getppid())]
    elif slurm_name() is not None and int(env.get("SLURM_NTASKS", "1")) > 1:
        parts = ["srun", slurm_name(), env.get("SLURM_RESTART_COUNT", "0")]
    else:
        return None
    return f"{parts[0]}-{hashlib.sha256(chr(0).join(parts).encode()).hexdigest()[:16]}"


def run_folder(log_dir: str, task_name: str, timeout_s: float = 120.0) -> Path:
    """The folder of a new run, `<log_dir>/<task_name>/runs/<name>`, the same in all its ranks.

    Rank 0 claims it (the name is the SLURM job's, or the date and time); the other ranks of a
    torchrun or srun launch wait for rank 0 to name it. Claimed once per process.
    """

    def claim() -> Path:
        runs = Path(log_dir) / task_name / "runs"
        name = slurm_name()
        return claim_slurm_folder(runs, name) if name else claim_folder(runs, run_stamp())

    return _claim_once(log_dir, task_name, "", claim, timeout_s)


def sweep_folder(log_dir: str, task_name: str, timeout_s: float = 120.0) -> str:
    """The folder of a new multirun, `<log_dir>/<task_name>/multiruns/<date>_<time>`: its jobs
    are its numbered sub-folders. Shared by the ranks of a launch, as `run_folder` is."""

    def claim() -> Path:
        return claim_folder(Path(log_dir) / task_name / "multiruns", run_stamp())

    return str(_claim_once(log_dir, f"{task_name}/multiruns", "-multirun", claim, timeout_s))


def _claim_once(
    log_dir: str, what: str, suffix: str, claim: Callable[[], Path], timeout_s: float
) -> Path:
    """`claim()` in rank 0 of a launch, whose other ranks read the result from a handshake."""
    key = (log_dir, what)
    if key not in _claimed:
        launch = launch_id()
        handshake = Path(log_dir) / LAUNCHES_DIR / f"{launch}{suffix}" if launch else None
        if handshake is not None and launch_rank() != 0:
            _claimed[key] = Path(_wait_for(handshake, timeout_s))
        else:
            folder = claim()
            if handshake is not None:
                _publish_handshake(handshake, folder)
            _claimed[key] = folder
    return _claimed[key]


def _publish_handshake(handshake: Path, folder: Path) -> None:
    # Readers never see half a path.
    write_atomically(handshake, lambda file: file.write(str(folder).encode()))
    _published.append(handshake)
    for old in handshake.parent.iterdir():
        try:
            if time.time() - old.stat().st_mtime > STALE_HANDSHAKE_S:
                old.unlink()
        except FileNotFoundError:  # another launch removed it first
            pass


def release_handshakes() -> None:
    """Remove the handshake files this process wrote. Call it once every rank has read them:
    when the ranks have met in the process group, or in a launch of one process."""
    while _published:
        _published.pop().unlink(missing_ok=True)


def _wait_for(handshake: Path, timeout_s: float) -> str:
    deadline = time.monotonic() + timeout_s
    while not handshake.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank 0 did not write {handshake} within {timeout_s} s")
        time.sleep(0.05)
    return handshake.read_text()
