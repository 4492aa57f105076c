"""Pictures of a run: learning curves after fit, the test confusion matrix after test."""

import csv
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from torchmetrics.classification import MulticlassConfusionMatrix

# {"train/loss": {epoch: value}}: one value per epoch, as the epoch-level metrics are logged.
History = dict[str, dict[int, float]]

STAGES = ("train", "val")


def read_history(metrics_csv: str | Path) -> History:
    """The epoch-level values in a CSVLogger's metrics.csv: `{name: {epoch: value}}`."""
    history: History = defaultdict(dict)
    if not Path(metrics_csv).is_file():
        return history
    with open(metrics_csv, newline="") as f:
        for row in csv.DictReader(f):
            if not row.get("epoch"):
                continue
            for name, value in row.items():
                if value and name.startswith(tuple(f"{s}/" for s in STAGES)):
                    history[name][int(float(row["epoch"]))] = float(value)
    return history


def learning_curves_figure(history: History, metrics: Sequence[str]) -> Figure | None:
    """One panel per metric name (`loss`, `acc`, ...), one line per stage (train, val).

    Names with no logged values are left out; None when nothing was logged at all.
    """
    names = [n for n in metrics if any(history.get(f"{s}/{n}") for s in STAGES)]
    if not names:
        return None
    figure = _figure(width=5 * len(names), height=4)
    for ax, name in zip(figure.subplots(1, len(names), squeeze=False)[0], names, strict=True):
        for stage in STAGES:
            values = history.get(f"{stage}/{name}")
            if values:
                epochs = sorted(values)
                ax.plot(epochs, [values[e] for e in epochs], marker="o", label=stage)
        ax.set_title(name)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend()
    return figure


def _figure(width: float, height: float) -> Figure:
    """A bare Figure on the Agg canvas: no pyplot state, no GUI backend, safe in any process."""
    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def confusion_matrix_figure(confmat: torch.Tensor) -> Figure:
    """torchmetrics' own confusion-matrix plot on an Agg figure, titled with count and accuracy."""
    figure = _figure(width=6.5, height=6.5)
    ax = figure.subplots()
    num_classes = confmat.shape[0]
    # Numbers in the cells stay readable up to about 20 classes.
    MulticlassConfusionMatrix(num_classes).plot(val=confmat, ax=ax, add_text=num_classes <= 20)
    total = int(confmat.sum())
    accuracy = confmat.trace().item() / max(total, 1)
    ax.set_title(f"Test confusion matrix: {total} samples, accuracy {accuracy:.3f}")
    return figure


class RunPlots(Callback):
    """Learning curves (PNG) at the end of fit; the test confusion matrix (PNG, CSV) after test.

    Epoch-level values are read from `trainer.callback_metrics` once per epoch (train and val
    epoch ends), never per step. The confusion matrix is a torchmetrics metric updated on every
    test batch on the device and reduced across ranks when the test ends; it needs a module with
    `hparams.num_classes` (or `num_classes` here) and batches `(inputs, targets)`. What a module
    does not log (e.g. accuracy of a language model) is skipped. Rank 0 writes the files and, when
    a TensorBoardLogger is on, adds the figures to it under `plots/`.

    Args:
        output_dir: folder for the PNG files; the trainer's `default_root_dir` when None.
        metrics: metric names to plot, logged as `train/<name>` and `val/<name>`.
        curves_file: file name of the learning curves.
        confusion_matrix_file: file name of the confusion matrix.
        num_classes: class count when the module's hparams do not have it.
    """

    def __init__(
        self,
        output_dir: str | None = None,
        metrics: Sequence[str] = ("loss", "acc"),
        curves_file: str = "learning_curves.png",
        confusion_matrix_file: str = "confusion_matrix.png",
        num_classes: int | None = None,
    ):
        self.output_dir = output_dir
        self.metrics = list(metrics)
        self.curves_file = curves_file
        self.confusion_matrix_file = confusion_matrix_file
        self.num_classes = num_classes
        self.history: History = defaultdict(dict)
        self.confusion_matrix: torch.Tensor | None = None  # the last test's, on the CPU
        self._test_confmat: MulticlassConfusionMatrix | None = None

    # Learning curves.

    # Modules log their train metrics in their own on_train_epoch_end, which Lightning calls after
    # this callback's: an epoch's train values are read when the next epoch starts or training
    # ends, when Lightning already counts that epoch as completed.

    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._record_completed_train_epoch(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._record_completed_train_epoch(trainer)

    def _record_completed_train_epoch(self, trainer: L.Trainer) -> None:
        if trainer.current_epoch > 0:
            self._record(trainer, "train", trainer.current_epoch - 1)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # The sanity check runs before the first epoch and is not one.
        if not trainer.sanity_checking:
            self._record(trainer, "val", trainer.current_epoch)

    def _record(self, trainer: L.Trainer, stage: str, epoch: int) -> None:
        if not trainer.is_global_zero:
            return
        # callback_metrics hold the epoch values already reduced over ranks; reading them is one
        # host sync per epoch.
        for name in self.metrics:
            value = trainer.callback_metrics.get(f"{stage}/{name}")
            if value is not None:
                self.history[f"{stage}/{name}"][epoch] = float(value)

    # A resumed run plots the whole run: the epochs before it come with the checkpoint, and from
    # the run's metrics.csv, which also holds the train values of the epoch the checkpoint ended
    # (logged after it was saved).

    def state_dict(self) -> dict[str, Any]:
        return {"history": {name: dict(values) for name, values in self.history.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        for name, values in state_dict.get("history", {}).items():
            self.history[name].update(values)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                if isinstance(logger, CSVLogger):
                    logger.save()  # rows still buffered
                    for name, values in read_history(logger.experiment.metrics_file_path).items():
                        self.history[name].update(values)
            figure = learning_curves_figure(self.history, self.metrics)
            if figure is not None:
                self._save(trainer, figure, self.curves_file, "plots/learning_curves")

    # Confusion matrix.

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        num_classes = pl_module.hparams.get("num_classes", self.num_classes)
        self._test_confmat = None
        if num_classes is not None:
            # A metric is state, not model or data: it must live where the predictions are.
            self._test_confmat = MulticlassConfusionMatrix(num_classes).to(pl_module.device)

    def on_test_batch_end(
        self,
        trainer: L.Trainer,
        pl_module: L.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if self._test_confmat is None:
            return
        if isinstance(outputs, dict) and "preds" in outputs and "targets" in outputs:
            preds, targets = outputs["preds"], outputs["targets"]
        else:
            # The module's test_step returns nothing: predict again, in the run's precision.
            *inputs, targets = batch  # (images, labels) or (sequences, lengths, labels)
            with trainer.precision_plugin.forward_context():
                preds = pl_module(*inputs).argmax(dim=1)
        self._test_confmat.update(preds, targets)

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._test_confmat is None:
            return
        # compute() gathers every rank's counts, so every rank must call it.
        self.confusion_matrix = self._test_confmat.compute().cpu()
        self._test_confmat = None
        if trainer.is_global_zero:
            figure = confusion_matrix_figure(self.confusion_matrix)
            path = self._save(trainer, figure, self.confusion_matrix_file, "plots/confusion_matrix")
            # The counts as numbers too (rows: true class, columns: predicted class).
            np.savetxt(path.with_suffix(".csv"), self.confusion_matrix.numpy(), "%d", ",")

    def _save(self, trainer: L.Trainer, figure: Figure, file_name: str, tag: str) -> Path:
        folder = Path(self.output_dir or trainer.default_root_dir)
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / file_name
        figure.savefig(path)
        rank_zero_info(f"Saved {path}")
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_figure(tag, figure, global_step=trainer.global_step)
        return path
