"""Lightning's CSVLogger, but a run resumed in its folder adds to its metrics.csv, and no kill
loses a row of it."""

import csv
import io
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

from lightning.fabric.loggers.logger import rank_zero_experiment
from lightning.pytorch.core.saving import save_hparams_to_yaml
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.loggers.csv_logs import ExperimentWriter
from lightning.pytorch.utilities import rank_zero_only

from kindling.files import write_atomically

# A row Lightning is still to log, and its step.
Row = tuple[dict[str, Any], int]


class ResumableCSVLogger(CSVLogger):
    """`metrics.csv` holds every epoch of a run, however often it was resumed or killed.

    Lightning's CSVLogger deletes the metrics.csv it finds. This one keeps its rows when training
    resumes from a checkpoint (Lightning calls `ContinueLoggedMetrics`, which
    calls `continue_after`): the rows the checkpoint covers stay, the rows logged after it was saved
    (an epoch that a killed run did not finish) go, since the resumed run logs that epoch again,
    and the resumed run's rows follow. So no epoch is missing and none appears twice. A new run in
    a folder with a metrics.csv (no checkpoint) replaces it, as Lightning's does.

    Every row a checkpoint covers is on disk before the checkpoint is (`save_before_checkpoint`),
    and the file is only ever appended to or replaced whole, so a kill at any moment leaves a
    history that a run resumed from the newest checkpoint completes.

    `hparams.yaml` of the first run is kept; each resumed run's is `hparams_resumed_<n>.yaml`.
    Arguments are Lightning's CSVLogger's.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._written_ahead: Row | None = None

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

    @rank_zero_only
    def save_before_checkpoint(self, to_come: Row | None) -> None:
        """Put on disk, synced, every row logged so far and `to_come`: the row that Lightning
        logs only after the checkpoint being saved (an epoch's train values). When Lightning
        logs it, it is not written again."""
        if to_come is not None and to_come != self._written_ahead:
            self.log_metrics(*to_come)
            self._written_ahead = to_come
        self.save()
        self.experiment.sync()

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        ahead, self._written_ahead = self._written_ahead, None
        if ahead is not None and step == ahead[1]:
            # What the checkpoint's save wrote already; anything a later hook added is new.
            metrics = {k: v for k, v in metrics.items() if k == "epoch" or ahead[0].get(k) != v}
            if metrics.keys() <= {"epoch"}:
                return
        super().log_metrics(metrics, step)


class ContinuingWriter(ExperimentWriter):
    """Lightning's writer of metrics.csv and hparams.yaml, keeping what a resumed run continues;
    a rewrite of metrics.csv (a resumed run's, or a new column's) replaces the file whole."""

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
        keys, rows = self._read()
        self._replace(keys, [row for row in rows if _logged_until(row, epoch, step)])
        self.metrics_keys = sorted(set(self.metrics_keys) | set(keys))

    def save(self) -> None:
        """Append the rows logged since the last save; with a new column, replace the file."""
        if not self.metrics:
            return
        if self._first_save:
            self._first_save = False
            if not self._continuing and os.path.isfile(self.metrics_file_path):
                os.remove(self.metrics_file_path)  # a new run: its own rows only
        keys = sorted(set(self.metrics_keys).union(*self.metrics))
        if not os.path.isfile(self.metrics_file_path):
            self._replace(keys, self.metrics)
        elif keys != self.metrics_keys:
            # Lightning's writer rewrites the file in place here: a kill would cut it short.
            self._replace(keys, [*self._read()[1], *self.metrics])
        else:
            with open(self.metrics_file_path, "a", newline="") as file:
                csv.DictWriter(file, fieldnames=keys).writerows(self.metrics)
        self.metrics_keys, self.metrics = keys, []

    def sync(self) -> None:
        """Flush metrics.csv to the disk, so that even a power cut keeps what it holds now."""
        if os.path.isfile(self.metrics_file_path):
            with open(self.metrics_file_path, "rb+") as file:
                os.fsync(file.fileno())

    def _read(self) -> tuple[list[str], list[dict[str, str]]]:
        with open(self.metrics_file_path, newline="") as file:
            reader = csv.DictReader(file)
            return list(reader.fieldnames or []), list(reader)

    def _replace(self, keys: list[str], rows: list[dict[str, Any]]) -> None:
        """metrics.csv with `keys` as its header and `rows`, in one rename."""

        def write(file: BinaryIO) -> None:
            text = io.TextIOWrapper(file, newline="")  # the encoding open() gives
            writer = csv.DictWriter(text, fieldnames=keys)
            writer.writeheader()
            writer.writerows(rows)
            text.detach()  # flushes; `file` stays open for write_atomically to sync

        write_atomically(Path(self.metrics_file_path), write, durable=True)


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
