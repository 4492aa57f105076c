"""What each run leaves in its folder for the report of a multirun (`kindling.report`): its last
metrics (`results.yaml`), how a multirun's job ended (`job.yaml`), an Optuna trial (`trial.yaml`,
which knows a pruned one); the clean process a multirun's next job starts in; and the Hydra
callback of every multirun, which takes the sweep folder when the multirun starts and reports the
multirun when it ends or is cut off."""

import atexit
import logging
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from lightning_utilities.core.rank_zero import rank_zero_only  # Lightning's, without torch
from omegaconf import DictConfig

from kindling.files import write_atomically
from kindling.run.run_folder import claim, launched

log = logging.getLogger(__name__)

JOB_FILE, RESULTS_FILE, TRIAL_FILE = "job.yaml", "results.yaml", "trial.yaml"
# What Lightning's DDP launcher writes into os.environ of the launching process: left set, the
# sweep's next job would think its ranks started outside.
_LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


def write_yaml(path: Path, record: dict[str, Any]) -> None:
    text = yaml.safe_dump(record, sort_keys=False, width=float("inf"))
    write_atomically(path, lambda file: file.write(text.encode()))


@rank_zero_only
def save_results(metrics: dict, run_dir: str | Path) -> None:
    """The run's last metrics (the last validation's, the best checkpoint's test)."""
    write_yaml(Path(run_dir) / RESULTS_FILE, {n: float(v) for n, v in sorted(metrics.items())})


@contextmanager
def recorded_job(run_dir: str | Path) -> Iterator[None]:
    """In a multirun, rank 0 writes `job.yaml`: `running`, then `completed`, `failed` with the
    error, or `interrupted` with the exit code (a killed job's stays `running`: the report calls
    it interrupted too)."""
    multirun = HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN
    if not multirun or rank_zero_only.rank != 0:
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


class MultirunReport(Callback):
    sweep_dir: Path | None = None  # on the launching process alone

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        claim(config.hydra.sweep.dir)  # a SLURM job's, named by run_folder.sweep_folder
        if launched():
            from kindling.run.launched import launch

            if launch()[0] != 0:
                return
        self.sweep_dir = Path(config.hydra.sweep.dir)
        # Hydra's basic sweeper raises the first failed job's error once all jobs have run, and
        # then skips on_multirun_end: such a multirun (or one stopped by Ctrl-C) reports at exit.
        atexit.register(self.report)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        atexit.unregister(self.report)
        self.report()

    def report(self) -> None:
        if self.sweep_dir is None or not any(self.sweep_dir.glob("*/.hydra")):
            return  # no job started (SLURM refused them, say): nothing to report
        from kindling.report import write_report  # matplotlib and the tables: multiruns only

        try:
            print(write_report(self.sweep_dir), flush=True)
        except Exception as error:  # the jobs' own results are in their folders whatever happens
            log.warning("No report of the multirun in %s: %s", self.sweep_dir, error)
