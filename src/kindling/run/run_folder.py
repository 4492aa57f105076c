"""Run folders: one per run, named from what every process of its launch already knows, written
by one run at a time; resumed training continues in its checkpoint's folder, its record beside
the first's.

- By hand: date, time and a random suffix, `2026-11-23_14-35-30_3fa2c1d0`. Ranks Lightning
  starts get rank 0's folder as `hydra.run.dir=` (`hydra_ddp.py`).
- torchrun: `torchrun-<run id>[-<restart>]` (`--rdzv-id`, or `--standalone`'s uuid); its default
  id `none` is the same in every launch, so it is refused.
- SLURM (also under torchrun): `slurm-<job id>[_<array task>][.<step>]`, the same in every task
  and every start of a requeued job, which so takes back its `hpc_ckpt_*.ckpt`; several runs of
  one job step take `-1`, `-2`, ... (`slurm.py`). Naming only reads; the run `claim`s its folder
  when it starts (`kindling.train`, and a multirun's in `kindling.multirun_report`). Both are
  named in `launched.py`, which only such runs load.

One run folder, one writer: two resumes of one run would interleave their epochs in metrics.csv.
Global rank 0 holds `flock` on `<run folder>/.lock`, which the system releases however the
process ends, and writes its name there for the refusal. Where the file system has no locks, and
on Windows, runs go unlocked.

Naming and claiming import no library: a job's script may name its folder without torch's seconds.
"""

import errno
import functools
import logging
import os
import secrets
import shlex
import shutil
import socket
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from kindling.errors import UserError
from kindling.run import LAST_CHECKPOINT

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

log = logging.getLogger(__name__)

IN_SLURM_JOB = ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID")
LAUNCHED_BY = ("TORCHELASTIC_RUN_ID", *IN_SLURM_JOB)  # torchrun, SLURM


def run_stamp() -> str:
    """The date and time and a random suffix, `2026-11-23_14-35-30_3fa2c1d0`: unique on its own."""
    return f"{datetime.now():%Y-%m-%d_%H-%M-%S}_{secrets.token_hex(4)}"


def run_folder(log_dir: str, task_name: str) -> Path:
    """The folder of a new run, `<log_dir>/<task_name>/runs/<name>`, the same in all its ranks."""
    return _new_folder(os.getcwd(), Path(log_dir) / task_name / "runs")


def sweep_folder(log_dir: str, task_name: str) -> str:
    """The folder of a new multirun, `<log_dir>/<task_name>/multiruns/<name>`."""
    return str(_new_folder(os.getcwd(), Path(log_dir) / task_name / "multiruns"))


# One folder per process however often the config is resolved; per working folder too, as
# `log_dir` is relative (`logs`): a process that runs again elsewhere gets a folder there.
@functools.cache
def _new_folder(cwd: str, parent: Path) -> Path:
    """By hand: a new stamp. SLURM: `<parent>/slurm-...` (`slurm.job_folder`). torchrun:
    `<parent>/torchrun-...`."""
    if not launched():
        return parent / run_stamp()
    from kindling.run.launched import slurm_name, torchrun_name

    name = slurm_name()
    if name is None:
        return parent / torchrun_name()
    from kindling.run.slurm import job_folder

    return job_folder(parent, name)


def launched() -> bool:
    """Whether torchrun started this process or it runs in a SLURM job: the launch names its run
    folder (`kindling.run.launched`)."""
    return any(name in os.environ for name in LAUNCHED_BY)


def claim(folder: str | Path) -> None:
    """Take a SLURM run folder for this command and rank (`slurm.claim`); elsewhere nothing."""
    if any(name in os.environ for name in IN_SLURM_JOB):
        from kindling.run.slurm import claim

        claim(folder)


_held: dict[Path, int] = {}  # the lock's file descriptor of each folder this process holds


def hold(folder: str | Path) -> None:
    """Claim `folder` (a SLURM run's) and lock it until `release`; refuse one a live run holds."""
    from lightning.pytorch.utilities import rank_zero_only

    claim(folder)
    folder = Path(folder).resolve()
    # Global rank 0: the launching process, or rank 0 of torchrun or srun (NODE_RANK: the first
    # process of each node of a Lightning launch over several).
    launching = rank_zero_only.rank == 0 and os.environ.get("NODE_RANK", "0") == "0"
    if fcntl is None or folder in _held or not launching:
        return
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / ".lock", os.O_RDWR | os.O_CREAT, 0o644)
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


def run_dir(log_dir: str, task_name: str, *, _root_: Any) -> str:
    """Hydra's run folder (`${run_dir:...}`): the checkpoint's when resuming there, else new."""
    return str(_resume_folder(_root_) or run_folder(log_dir, task_name))


_records: dict[Path, str] = {}  # the record folder this process chose in each run folder


def hydra_subdir(stamp: str, *, _root_: Any) -> str | None:
    """Where Hydra writes the config: `.hydra`, or `.hydra/resumed_<stamp>` (this process's alone)
    when resuming in an existing folder, so the first run's config is never overwritten. A new
    run in a folder an earlier one trained in (`hydra.run.dir=`) writes `.hydra/refused_<stamp>`,
    which `refuse_used` turns into a refusal before anything else is written; a continued
    multirun's job (`continuation.py`) writes nothing where it completed before, and
    `.hydra/resumed_<stamp>` where it resumes."""
    folder = _resume_folder(_root_)
    if folder is not None:
        return _records.setdefault(folder, f".hydra/resumed_{stamp}")
    from omegaconf import OmegaConf

    output_dir = OmegaConf.select(_root_, "hydra.runtime.output_dir")  # None: composed, not run
    if output_dir is None:
        return ".hydra"
    folder = Path(output_dir).resolve()
    # What a new run would replace (an attempt refused before training left neither: the CSV
    # logger's metrics.csv, configs/logger/csv.yaml). Resumed training continues the folder's
    # files; a launch (SLURM, torchrun) names its folders itself: a requeued job takes its own.
    trained = any((folder / "checkpoints").glob("*.ckpt")) or (folder / "csv/metrics.csv").exists()
    used = folder not in _records and trained and not _resumes_training(_root_) and not launched()
    if used and str(OmegaConf.select(_root_, "hydra.mode")).endswith("MULTIRUN"):
        from kindling.run.continuation import earlier_job

        # A continued multirun (kindling/run/continuation.py): a completed job writes nothing.
        overrides = list(OmegaConf.select(_root_, "hydra.overrides.task"))
        earlier = earlier_job(folder, overrides)
        continued = {"completed": None, "resume": f".hydra/resumed_{stamp}", "restart": ".hydra"}
        if earlier is not None:
            return _records.setdefault(folder, continued[earlier])
    return _records.setdefault(folder, f".hydra/refused_{stamp}" if used else ".hydra")


def refuse_used(output_dir: str | Path) -> None:
    """Refuse a new run in a folder an earlier run left, which it would overwrite (checkpoints,
    metrics, record); the folder is left as it was, but for this attempt's lines in train.log."""
    if record_dir(output_dir).name.startswith("refused_"):
        forget_refused(output_dir)
        last = Path(output_dir) / LAST_CHECKPOINT
        resume = f" Resume it: python train.py ckpt_path={last}." if last.is_file() else ""
        raise UserError(
            f"{output_dir} holds an earlier run, which a new run there would overwrite.{resume} "
            "For a new run, leave out hydra.run.dir and hydra.sweep.dir: each run gets a folder "
            "of its own."
        )


def _resumes_training(root: Any) -> bool:
    return bool(root.get("ckpt_path") and root.get("train"))


def _resume_folder(root: Any) -> Path | None:
    """Resumed training (`ckpt_path`, `train=true`) goes on in its checkpoint's run folder unless
    `resume_in_new_folder=true`."""
    if not _resumes_training(root) or root.get("resume_in_new_folder"):
        return None
    from kindling.run.starting_checkpoint import resume_folder

    return resume_folder(root)


def record_dir(output_dir: str | Path) -> Path:
    """Where this run writes its record (config tree, provenance): the run folder, or its
    `.hydra/resumed_<stamp>/` when resumed in an existing folder."""
    from hydra.core.hydra_config import HydraConfig

    subdir = HydraConfig.get().output_subdir if HydraConfig.initialized() else None
    apart = subdir and Path(subdir).name.startswith(("resumed_", "refused_"))
    return Path(output_dir) / subdir if apart else Path(output_dir)


def forget_refused(output_dir: str | Path) -> None:
    """Remove a refused resume's `.hydra/resumed_<stamp>/`: the run folder is left as it was."""
    record = record_dir(output_dir)
    if record != Path(output_dir):
        shutil.rmtree(record, ignore_errors=True)
