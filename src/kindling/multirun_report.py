"""The Hydra callback of every multirun (`configs/hydra/default.yaml`): it takes the sweep folder
when the multirun starts and reports the multirun (`kindling.report`, loaded then) when it ends or
is cut off."""

import atexit
import logging
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from kindling.run.run_folder import claim, launched

log = logging.getLogger(__name__)


class MultirunReport(Callback):
    sweep_dir: Path | None = None  # on the launching process alone

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        claim(config.hydra.sweep.dir)  # a SLURM job's, named by run_folder.sweep_folder
        if launched():
            from kindling.run.launched import launch

            if launch()[0] != 0:
                return
        self.sweep_dir = Path(config.hydra.sweep.dir)
        # Imported now, not at exit, where Python no longer lets a module start its thread pool
        # (fsspec's, which the report's files import).
        import kindling.report  # noqa: F401 - the tables; matplotlib waits for the plot

        # Hydra's basic sweeper raises the first failed job's error once all jobs have run, and
        # then skips on_multirun_end: such a multirun (or one stopped by Ctrl-C) reports at exit.
        atexit.register(self.report)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        atexit.unregister(self.report)
        self.report()

    def report(self) -> None:
        if self.sweep_dir is None or not any(self.sweep_dir.glob("*/.hydra")):
            return  # no job started (SLURM refused them, say): nothing to report
        from kindling.report import write_report  # imported when the multirun started

        try:
            print(write_report(self.sweep_dir), flush=True)
        except Exception as error:  # the jobs' own results are in their folders whatever happens
            log.warning("No report of the multirun in %s: %s", self.sweep_dir, error)
