"""What each run leaves in its folder for the report of a multirun: its results, how it ended."""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.utilities import rank_zero_only

from kindling.files import write_atomically

# How a job of a multirun ended (kindling.multirun_report), and the run's last metrics
# (kindling.train). An Optuna sweep adds trial.yaml, which knows a pruned trial.
JOB_FILE = "job.yaml"
RESULTS_FILE = "results.yaml"
TRIAL_FILE = "trial.yaml"


def read_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text()) if path.is_file() else None


def write_yaml(path: Path, record: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    text = yaml.safe_dump(record, sort_keys=False, width=float("inf"))
    write_atomically(path, lambda file: file.write(text.encode()))


@rank_zero_only
def save_results(metrics: dict, run_dir: str | Path) -> None:
    """The run's last metrics (of the last validation, and the test of the best checkpoint) in
    its folder: kindling.report reads them back, whichever loggers the run had."""
    write_yaml(Path(run_dir) / RESULTS_FILE, {n: float(v) for n, v in sorted(metrics.items())})


@contextmanager
def recorded_job(run_dir: str | Path) -> Iterator[None]:
    """In a multirun, `job.yaml`: `running` from the start, then `completed`, `failed` with the
    error, or `interrupted` with the exit code (SIGTERM, SLURM's `scancel` or requeue, Ctrl-C:
    stopped at the end of a step and checkpointed). A job that is killed never writes its end:
    the report calls it interrupted too. Only rank 0 writes (the extra ranks of a DDP job are
    single runs of the same folder)."""
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    if not multirun or rank_zero_only.rank != 0:
        yield
        return
    path, started = Path(run_dir) / JOB_FILE, time.monotonic()
    record: dict[str, Any] = {"status": "running", "started": _now()}
    write_yaml(path, record)
    try:
        yield
    except SystemExit as stop:  # a signal: in a stage, saved at the end of the step
        record.update(status="interrupted", exit_code=stop.code)
        raise
    except Exception as error:
        record.update(status="failed", error=f"{type(error).__name__}: {error}")
        raise
    else:
        record["status"] = "completed"
    finally:
        if record["status"] != "running":
            record.update(ended=_now(), run_time_s=round(time.monotonic() - started, 3))
            write_yaml(path, record)


def _now() -> str:
    return datetime.now().isoformat(timespec="milliseconds")
