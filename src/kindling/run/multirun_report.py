"""The Hydra callback that records how each job of a multirun ended, and reports the multirun."""

import atexit
import logging
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from kindling.files import write_atomically
from kindling.report import JOB_FILE, read_yaml, write_report
from kindling.run.run_folder import launch_rank

log = logging.getLogger(__name__)


class MultirunReport(Callback):
    """`job.yaml` in each job's folder, and kindling.report's tables and plot in the sweep folder.

    A job writes `status: running` when it starts and `completed` or `failed` (with the error)
    when it ends, wherever it runs (the sweeping process, a joblib worker, a SLURM node). A job
    that is killed never writes its end: the report calls it interrupted. Only rank 0 of a
    multi-process launch writes; the extra ranks of a DDP job are single runs and write nothing.
    """

    def __init__(self) -> None:
        self.sweep_dir: Path | None = None

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if launch_rank() != 0:
            return
        self.sweep_dir = Path(config.hydra.sweep.dir)
        # Hydra's basic sweeper raises the first failed job's error once all jobs have run, and
        # then skips on_multirun_end: such a multirun (or one stopped by Ctrl-C) reports at exit.
        atexit.register(self.report)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        atexit.unregister(self.report)
        self.report()

    def report(self) -> None:
        if self.sweep_dir is None or not self.sweep_dir.is_dir():
            return
        try:
            print(write_report(self.sweep_dir), flush=True)
        except Exception as error:  # the jobs' own results are in their folders whatever happens
            log.warning("No report of the multirun in %s: %s", self.sweep_dir, error)

    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if _records(config):
            _write(config, {"status": "running", "started": _now()})

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if not _records(config):
            return
        record = read_yaml(_job_file(config)) or {}
        record["ended"] = _now()
        if "started" in record:
            started, ended = map(datetime.fromisoformat, (record["started"], record["ended"]))
            record["run_time_s"] = round((ended - started).total_seconds(), 3)
        if job_return.status == JobStatus.COMPLETED:
            record["status"] = "completed"
        else:
            record["status"] = "failed"
            error = job_return._return_value  # the exception; `return_value` would raise it
            record["error"] = f"{type(error).__name__}: {error}"
        _write(config, record)


def _records(config: DictConfig) -> bool:
    return config.hydra.mode == RunMode.MULTIRUN and launch_rank() == 0


def _job_file(config: DictConfig) -> Path:
    return Path(config.hydra.runtime.output_dir) / JOB_FILE


def _write(config: DictConfig, record: dict[str, Any]) -> None:
    text = yaml.safe_dump(record, sort_keys=False, width=float("inf"))
    write_atomically(_job_file(config), lambda file: file.write(text.encode()))


def _now() -> str:
    return datetime.now().isoformat(timespec="milliseconds")
