"""Run folders: one per run, named from what every process of its launch already knows.

No process waits for another to learn the name:

- Started by hand: the date and time and a random suffix, `2026-11-23_14-35-30_3fa2c1d0`, so runs
  started in the same second never share a folder. When Lightning starts ranks 1..N-1 itself, it
  hands them rank 0's folder as `hydra.run.dir=` (`hydra_ddp.py`).
- torchrun: `torchrun-<run id>`, the id torchrun gives every rank of a launch (`--rdzv-id`; a fresh
  uuid with `--standalone`, and in recent torch on one node without `--master-port`), `-<n>` after
  the n-th restart of its workers. Without an id (`none`) the ranks share nothing that sets this
  launch apart from the last one: the run stops and says how to give one.
- SLURM (first, also under torchrun): `slurm-<job id>[_<array task>][.<step>]`, the same in every
  task and in every start of a requeued job, which so takes back its folder and the
  `hpc_ckpt_*.ckpt` Lightning saved there. Several runs in one job step (a script that trains, then
  tests; a shell inside an allocation) would share that name: each run takes the first folder of
  that name (`-1`, `-2`, ...) that belongs to its own command line and that this process's rank
  has not taken yet in this start of the job. Every rank goes through the same folders in the
  same order, so the ranks of a run come to the same one, each on its own.
"""

import contextlib
import functools
import hashlib
import itertools
import os
import secrets
import shlex
import sys
from datetime import datetime
from pathlib import Path

from kindling.config.errors import UserError

# Inside a SLURM run folder: whose it is (command line) and which ranks took it in which start.
SLURM_OWNER_DIR = ".slurm"


def run_stamp() -> str:
    """The date and time and a random suffix, `2026-11-23_14-35-30_3fa2c1d0`: unique on its own."""
    return f"{datetime.now():%Y-%m-%d_%H-%M-%S}_{secrets.token_hex(4)}"


@functools.cache  # one folder per process, however often the config is resolved
def run_folder(log_dir: str, task_name: str) -> Path:
    """The folder of a new run, `<log_dir>/<task_name>/runs/<name>`, the same in all its ranks."""
    return _new_folder(Path(log_dir) / task_name / "runs")


@functools.cache
def sweep_folder(log_dir: str, task_name: str) -> str:
    """The folder of a new multirun, `<log_dir>/<task_name>/multiruns/<name>`: its jobs are its
    numbered sub-folders. Named as `run_folder` names a run's."""
    return str(_new_folder(Path(log_dir) / task_name / "multiruns"))


def _new_folder(parent: Path) -> Path:
    name = slurm_name()
    if name is not None:
        return claim_slurm_folder(parent, name)
    return parent / (torchrun_name() or run_stamp())


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


def torchrun_name() -> str | None:
    """`torchrun-<run id>[-<restart>]` in a process torchrun started, else None."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None:
        return None
    if run_id == "none":  # torchrun's default id, the same in every launch
        raise UserError(
            "torchrun started this run without an id of its own (--rdzv-id), so its processes "
            "cannot name one run folder. Give each launch its own: torchrun --standalone on one "
            "node, or --rdzv-id=<a new id, e.g. the job id> on every node."
        )
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"torchrun-{run_id}" + (f"-{restart}" if restart != "0" else "")


def check_launch() -> None:
    """Refuse a launch whose ranks cannot name one run folder, before Hydra composes (a refusal
    while Hydra resolves the run folder would come at the end of its traceback)."""
    if slurm_name() is None:
        torchrun_name()


def launch_rank() -> int:
    """This process's rank in its launch: torchrun's RANK, srun's SLURM_PROCID, else 0."""
    return _launch()[0]


def _launch() -> tuple[int, int]:
    """This process's rank and the number of processes of its launch (torchrun's or srun's)."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env:
        return int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    if "SLURM_STEP_ID" in env:  # a task of `srun`; a batch script's own processes are lone
        return int(env.get("SLURM_PROCID", "0")), int(env.get("SLURM_STEP_NUM_TASKS", "1"))
    return 0, 1


def claim_slurm_folder(parent: Path, name: str) -> Path:
    """`parent/name`, or `name-1`, `name-2`, ...: the first of its command line (and number of
    processes) that this rank has not taken in this start of the job (SLURM_RESTART_COUNT)."""
    rank, processes = _launch()
    command = f"{processes} x {shlex.join(sys.argv[1:])}"
    owner_id = hashlib.sha256(command.encode()).hexdigest()[:16]
    taken = f"start-{os.environ.get('SLURM_RESTART_COUNT', '0')}.rank-{rank}"
    for n in itertools.count():
        folder = parent / (name if n == 0 else f"{name}-{n}")
        owner = folder / SLURM_OWNER_DIR
        owner.mkdir(parents=True, exist_ok=True)
        # A link is made whole or not at all, by one process: the first command owns the folder.
        with contextlib.suppress(FileExistsError):
            os.symlink(owner_id, owner / "command")
        if os.readlink(owner / "command") != owner_id:
            continue
        try:
            (owner / taken).mkdir()
            return folder
        except FileExistsError:  # an earlier run of this command in this start of the job
            continue
    raise AssertionError("unreachable")
