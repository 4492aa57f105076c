"""What each run leaves in its folder for the report of a multirun (`kindling.report`): its last
metrics (`results.yaml`), how a multirun's job ended (`job.yaml`), an Optuna trial (`trial.yaml`,
which knows a pruned one); and the clean process a multirun's next job starts in."""

import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning_utilities.core.rank_zero import rank_zero_only  # Lightning's, without torch

from kindling.files import write_yaml
from kindling.run.continuation import JOB_FILE, read_record

log = logging.getLogger(__name__)

RESULTS_FILE, TRIAL_FILE = "results.yaml", "trial.yaml"
# What Lightning's DDP launcher writes into os.environ of the launching process: left set, the
# sweep's next job would think its ranks started outside.
_LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


@rank_zero_only
def save_results(metrics: dict, run_dir: str | Path) -> None:
    """The run's last metrics (the last validation's, the best checkpoint's test)."""
    write_yaml(Path(run_dir) / RESULTS_FILE, {n: float(v) for n, v in sorted(metrics.items())})


def kept(run_dir: str | Path, optimized_metric: str | None) -> float | None:
    """A continued multirun's job that completed before: said, and its result returned (what a
    sweeper optimises), its folder untouched."""
    print(f"{run_dir} completed before: kept as it is.", flush=True)
    results = read_record(Path(run_dir) / RESULTS_FILE) or {}
    return results.get(optimized_metric) if optimized_metric else None


@contextmanager
def recorded_job(run_dir: str | Path) -> Iterator[None]:
    """In a multirun, rank 0 writes `job.yaml`: `running`, then `completed`, `failed` with the
    error, or `interrupted` with the exit code (a killed job's stays `running`: the report calls
    it interrupted too). A multirun's job resumed by hand writes it again."""
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    if not (multirun or (Path(run_dir) / JOB_FILE).is_file()) or rank_zero_only.rank != 0:
        yield
        return
    path, started = Path(run_dir) / JOB_FILE, time.monotonic()
    record: dict[str, Any] = {"status": "running", "started": _now()}
    write_yaml(path, record)
    try:
        yield
        record["status"] = "completed"
    except SystemExit as stop:
        record.update(status="interrupted", exit_code=stop.code)
        raise
    except Exception as error:
        record.update(status="failed", error=f"{type(error).__name__}: {error}")
        raise
    finally:
        if record["status"] != "running":
            record.update(ended=_now(), run_time_s=round(time.monotonic() - started, 3))
            write_yaml(path, record)


@contextmanager
def job_environment() -> Iterator[None]:
    """Undo what a DDP job leaves behind: its process group, the launcher's variables."""
    saved = {name: os.environ.get(name) for name in _LAUNCHER_VARIABLES}
    try:
        yield
    finally:
        import torch.distributed  # a job's process has it already

        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _now() -> str:
    return datetime.now().isoformat(timespec="milliseconds")
