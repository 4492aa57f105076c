"""Lightning's CSVLogger, but a run resumed in its folder adds to its metrics.csv, and no kill
loses a row of it."""

import csv
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter

from kindling.files import write_atomically

Row = tuple[dict[str, Any], int]  # a row Lightning is still to log, and its step


class ResumableCSVLogger(CSVLogger):
    """`metrics.csv` holds every epoch of a run once, however often it was resumed or killed.
    Training resumed from a checkpoint (`ResumeExactly` calls `continue_after`) keeps the rows
    the checkpoint covers and appends; every row a checkpoint covers is on disk before it
    (`save_before_checkpoint`); the file is only appended to or replaced whole. A resumed run's
    hparams go to `hparams_resumed_<n>.yaml`. Rank 0 alone writes: the other ranks' `experiment`
    is Lightning's stand-in, which does nothing."""

    _written_ahead: Row | None = None  # by the last `save_before_checkpoint`

    @property
    @rank_zero_experiment
    def experiment(self) -> "ContinuingWriter":
        if self._experiment is None:
            os.makedirs(self.root_dir, exist_ok=True)
            self._experiment = ContinuingWriter(log_dir=self.log_dir)
        return self._experiment

    def continue_after(self, epoch: int, step: int) -> None:
        self.experiment.keep_rows_until(epoch, step)

    def save_before_checkpoint(self, to_come: Row | None) -> None:
        """Sync to disk every row logged so far and `to_come`, which Lightning logs only after
        the checkpoint (an epoch's train values; not written twice)."""
        if to_come is not None and to_come != self._written_ahead:
            self.log_metrics(*to_come)
            self._written_ahead = to_come
        self.save()

    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        ahead, self._written_ahead = self._written_ahead, None
        if (metrics, step) != ahead:  # not the row the checkpoint's save wrote already
            super().log_metrics(metrics, step)


class ContinuingWriter(ExperimentWriter):
    """Lightning's writer, keeping what a resumed run continues; metrics.csv is synced at each
    save, and a rewrite (a resumed run's, or a new column's) replaces it whole."""

    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir)
        n = 0
        while (Path(log_dir) / self.NAME_HPARAMS_FILE).exists():
            n += 1
            self.NAME_HPARAMS_FILE = f"hparams_resumed_{n}.yaml"
        self._new_run = True  # till its first save, or until it continues the file

    def _check_log_dir_exists(self) -> None:
        """Lightning's deletes metrics.csv here; this writer decides at its first save."""

    def keep_rows_until(self, epoch: int, step: int) -> None:
        """Drop the rows logged after the checkpoint at (`epoch`, `step`)."""
        self._new_run = False
        if os.path.isfile(self.metrics_file_path):
            keys, rows = self._read()
            self._replace(keys, [row for row in rows if _logged_until(row, epoch, step)])
            self.metrics_keys = sorted(set(self.metrics_keys) | set(keys))

    def save(self) -> None:
        if not self.metrics:
            return
        keys = sorted(set(self.metrics_keys).union(*self.metrics))
        if self._new_run or not os.path.isfile(self.metrics_file_path):
            self._replace(keys, self.metrics)  # a new run: its own rows only
        elif keys != self.metrics_keys:  # Lightning rewrites in place: a kill would cut it short
            self._replace(keys, [*self._read()[1], *self.metrics])
        else:
            with open(self.metrics_file_path, "a", newline="") as file:
                csv.DictWriter(file, fieldnames=keys).writerows(self.metrics)
                file.flush()
                os.fsync(file.fileno())
        self.metrics_keys, self.metrics, self._new_run = keys, [], False

    def _read(self) -> tuple[list[str], list[dict[str, str]]]:
        with open(self.metrics_file_path, newline="") as file:
            reader = csv.DictReader(file)
            return list(reader.fieldnames or []), list(reader)

    def _replace(self, keys: list[str], rows: list[dict[str, Any]]) -> None:
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=keys)
        writer.writeheader()
        writer.writerows(rows)
        data = text.getvalue().encode()
        write_atomically(Path(self.metrics_file_path), lambda file: file.write(data), durable=True)


def _logged_until(row: dict[str, str], epoch: int, step: int) -> bool:
    """Whether a row was logged before a checkpoint saved in `epoch` at global step `step`. Test
    rows stay; a row without an epoch (LearningRateMonitor's) names the step it precedes."""
    if any(value and name.startswith("test/") for name, value in row.items()):
        return True
    row_step = int(float(row["step"])) if row.get("step") else 0
    if row.get("epoch"):
        row_epoch = int(float(row["epoch"]))
        return row_epoch < epoch or (row_epoch == epoch and row_step <= step)
    return row_step < step
