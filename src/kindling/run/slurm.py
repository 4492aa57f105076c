"""What a run does inside a SLURM job, loaded there only: the job's run folders, each claimed by
its command line, and the checkpoint and requeue when SLURM stops the job."""

import hashlib
import itertools
import os
import shlex
import subprocess
import sys
from contextlib import suppress
from pathlib import Path

from kindling.run.launched import launch

OWNER_DIR = ".slurm"  # in a SLURM run folder: its command line, and who claimed it when


def job_folder(parent: Path, name: str) -> Path:
    """`<parent>/<name>`, or `-1`, `-2`, ...: the first that is this command line's and not yet
    claimed by this rank in this start of the job."""
    for n in itertools.count():
        folder = parent / (name if n == 0 else f"{name}-{n}")
        owner = folder / OWNER_DIR
        with suppress(OSError):  # no link: a new folder
            # Another command's, or an earlier run of this command in this start of the job.
            if os.readlink(owner / "command") != _owner_id() or (owner / _claim_name()).exists():
                continue
        return folder


def claim(folder: str | Path) -> None:
    """Mark a SLURM run folder as this command's and this rank's in this start of the job."""
    owner = Path(folder) / OWNER_DIR
    owner.mkdir(parents=True, exist_ok=True)
    with suppress(FileExistsError):  # a link is made whole or not at all: the first one owns it
        os.symlink(_owner_id(), owner / "command")
    (owner / _claim_name()).mkdir(exist_ok=True)


def _owner_id() -> str:
    """The command line and number of processes of this launch, hashed."""
    command = f"{launch()[1]} x {shlex.join(sys.argv[1:])}"
    return hashlib.sha256(command.encode()).hexdigest()[:16]


def _claim_name() -> str:
    return f"start-{os.environ.get('SLURM_RESTART_COUNT', '0')}.rank-{launch()[0]}"


def next_hpc_checkpoint(run_dir: str | Path) -> str:
    """`<run_dir>/hpc_ckpt_<n>.ckpt`, n above any there: Lightning resumes a SLURM job from the
    highest when it starts with no `ckpt_path`."""
    taken = [int(p.stem.rpartition("_")[2]) for p in Path(run_dir).glob("hpc_ckpt_*.ckpt")]
    return str(Path(run_dir) / f"hpc_ckpt_{max(taken, default=0) + 1}.ckpt")


def requeue(checkpoint: str) -> None:
    """Put this SLURM job (or array task) back in the queue."""
    from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn

    job = os.environ["SLURM_JOB_ID"]
    if "SLURM_ARRAY_JOB_ID" in os.environ:
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if done.returncode == 0:
        rank_zero_info(f"Requeued SLURM job {job}: it resumes from {checkpoint}.")
    else:
        why = done.stderr.strip()
        rank_zero_warn(f"Could not requeue SLURM job {job} ({why}): resume, ckpt_path={checkpoint}")
