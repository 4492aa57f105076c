"""Lightning's CSVLogger, but a run resumed in its folder adds to its metrics.csv."""

import csv
import os
from pathlib import Path
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities import rank_zero_only


class ResumableCSVLogger(CSVLogger):
    """`metrics.csv` holds every epoch of a run, however often it was resumed.

    Lightning's CSVLogger deletes the metrics.csv it finds. This one keeps its rows when training
    resumes from a checkpoint (Lightning calls `kindling.callbacks.ContinueLoggedMetrics`, which
    calls `continue_after`): the rows the checkpoint covers stay, the rows logged after it was saved
    (an epoch that a killed run did not finish) go, since the resumed run logs that epoch again,
    and the resumed run's rows follow. So no epoch is missing and none appears twice. A new run in
    a folder with a metrics.csv (no checkpoint) replaces it, as Lightning's does.

    `hparams.yaml` of the first run is kept; each resumed run's is `hparams_resumed_<n>.yaml`.
    Arguments are Lightning's CSVLogger's.
    """

    @property
    @rank_zero_experiment
    def experiment(self) -> "ContinuingWriter":
        if self._experiment is None:
            os.makedirs(self.root_dir, exist_ok=True)
            self._experiment = ContinuingWriter(log_dir=self.log_dir)
        return self._experiment

    @rank_zero_only
    def continue_after(self, epoch: int, step: int) -> None:
        """Keep the rows of epochs up to `epoch` logged at steps up to `step`; append after them."""
        self.experiment.keep_rows_until(epoch, step)


class ContinuingWriter(ExperimentWriter):
    """Lightning's writer of metrics.csv and hparams.yaml, keeping what a resumed run continues."""

    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir)
        self.hparams_file = Path(log_dir) / self.NAME_HPARAMS_FILE
        for n in range(1, 10_000):
            if not self.hparams_file.exists():
                break
            self.hparams_file = Path(log_dir) / f"hparams_resumed_{n}.yaml"
        self._continuing = False
        self._first_save = True

    def _check_log_dir_exists(self) -> None:
        """Lightning's deletes metrics.csv here; this writer decides at its first save."""

    def log_hparams(self, params: dict[str, Any]) -> None:
        self.hparams.update(params)
        save_hparams_to_yaml(self.hparams_file, self.hparams)

    def keep_rows_until(self, epoch: int, step: int) -> None:
        """Drop the rows logged after the checkpoint at (`epoch`, `step`); keep the header."""
        self._continuing = True
        if not os.path.isfile(self.metrics_file_path):
            return
        with open(self.metrics_file_path, newline="") as f:
            reader = csv.DictReader(f)
            keys, rows = list(reader.fieldnames or []), list(reader)
        kept = [row for row in rows if _logged_until(row, epoch, step)]
        with open(self.metrics_file_path, "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=keys)
            writer.writeheader()
            writer.writerows(kept)
        self.metrics_keys = sorted(set(self.metrics_keys) | set(keys))

    def save(self) -> None:
        if self.metrics and self._first_save:
            self._first_save = False
            if not self._continuing and os.path.isfile(self.metrics_file_path):
                os.remove(self.metrics_file_path)  # a new run: its own rows only
        super().save()


def _logged_until(row: dict[str, str], epoch: int, step: int) -> bool:
    """Whether a row was logged before a checkpoint saved in `epoch` at global step `step`, or
    is a test result (kept: the record of the model tested then).

    A row with an epoch (what the Trainer logs) is covered when its epoch came before, or it is
    the same epoch at a step not after. A row without one (LearningRateMonitor's) was logged
    before the step it names, so only rows before the checkpoint's step are covered.
    """
    if any(value and name.startswith("test/") for name, value in row.items()):
        return True  # a test of an earlier part of the run: training never logs it again
    row_step = int(float(row["step"])) if row.get("step") else 0
    if row.get("epoch"):
        row_epoch = int(float(row["epoch"]))
        return row_epoch < epoch or (row_epoch == epoch and row_step <= step)
    return row_step < step
