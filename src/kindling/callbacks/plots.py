"""Pictures of a run: learning curves after fit, the test confusion matrix after test."""

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities import rank_zero_info
from matplotlib.figure import Figure
from torchmetrics.classification import MulticlassConfusionMatrix

History = dict[str, dict[int, float]]  # {"train/loss": {epoch: value}}
STAGES = ("train", "val")


def learning_curves_figure(history: History, metrics: Sequence[str]) -> Figure | None:
    """One panel per metric logged (`loss`, `acc`, ...), one line per stage; None if none was."""
    names = [n for n in metrics if any(history.get(f"{s}/{n}") for s in STAGES)]
    if not names:
        return None
    # A bare Figure (no pyplot): no GUI backend, no global state, safe in any process.
    figure = Figure(figsize=(5 * len(names), 4), layout="constrained")
    for ax, name in zip(figure.subplots(1, len(names), squeeze=False)[0], names, strict=True):
        for stage in STAGES:
            if values := history.get(f"{stage}/{name}"):
                ax.plot(*zip(*sorted(values.items()), strict=True), marker="o", label=stage)
        ax.set(title=name, xlabel="epoch")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
        ax.legend()
    return figure


def confusion_matrix_figure(confmat: torch.Tensor) -> Figure:
    """torchmetrics' confusion-matrix plot, titled with the count and accuracy."""
    figure = Figure(figsize=(6.5, 6.5), layout="constrained")
    ax, n = figure.subplots(), confmat.shape[0]
    MulticlassConfusionMatrix(n).plot(val=confmat, ax=ax, add_text=n <= 20)  # readable to ~20
    total = int(confmat.sum())
    accuracy = confmat.trace().item() / max(total, 1)
    ax.set_title(f"Test confusion matrix: {total} samples, accuracy {accuracy:.3f}")
    return figure


class RunPlots(Callback):
    """`curves_file` (learning curves of `metrics`, logged as `train/<name>`, `val/<name>`) at
    the end of fit; `confusion_matrix_file` (PNG and CSV) after test, of the `preds` and
    `targets` the test step returns (as `Classifier`'s does) over `hparams.num_classes` (or
    `num_classes` here). The history travels in checkpoints, an epoch's train values with the
    epoch's, so a resumed run plots the whole run. Rank 0 writes the files into `output_dir`
    (default: the trainer's folder), and to a TensorBoardLogger."""

    def __init__(
        self,
        output_dir: str | None = None,
        metrics: Sequence[str] = ("loss", "acc"),
        curves_file: str = "learning_curves.png",
        confusion_matrix_file: str = "confusion_matrix.png",
        num_classes: int | None = None,
    ):
        self.output_dir, self.metrics, self.num_classes = output_dir, list(metrics), num_classes
        self.curves_file, self.confusion_matrix_file = curves_file, confusion_matrix_file
        self.history: History = defaultdict(dict)
        self._test_confmat: MulticlassConfusionMatrix | None = None

    # Modules log train values in their own on_train_epoch_end, which runs after this one's: an
    # epoch's are read when the next one starts, or training ends.
    def on_train_epoch_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.current_epoch > 0:
            self._record(trainer, "train", trainer.current_epoch - 1)

    on_train_end = on_train_epoch_start

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._record(trainer, "val", trainer.current_epoch)

    def _record(self, trainer: L.Trainer, stage: str, epoch: int) -> None:
        for name in self.metrics:  # values reduced over ranks already: one host sync per epoch
            value = trainer.callback_metrics.get(f"{stage}/{name}")
            if value is not None and trainer.is_global_zero:
                self.history[f"{stage}/{name}"][epoch] = float(value)

    def setup(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        self._trainer = trainer

    def state_dict(self) -> dict[str, Any]:
        # An epoch's checkpoints are saved once its train values are logged: they go with them.
        progress = self._trainer.fit_loop.epoch_progress.current
        if progress.processed > progress.completed:
            self._record(self._trainer, "train", self._trainer.current_epoch)
        return {"history": {name: dict(values) for name, values in self.history.items()}}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history.update(state_dict["history"])  # loaded before any epoch is recorded

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        if figure := learning_curves_figure(self.history, self.metrics):
            self._save(trainer, figure, self.curves_file, "plots/learning_curves")

    def on_test_batch_end(self, trainer: L.Trainer, pl_module: Any, outputs: Any, *_: Any) -> None:
        num_classes = pl_module.hparams.get("num_classes", self.num_classes)
        if num_classes is None or not (isinstance(outputs, dict) and "preds" in outputs):
            return
        if self._test_confmat is None:
            self._test_confmat = MulticlassConfusionMatrix(num_classes).to(pl_module.device)
        self._test_confmat.update(outputs["preds"], outputs["targets"])

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._test_confmat is None:
            return
        confmat = self._test_confmat.compute().cpu()  # on every rank: it gathers
        self._test_confmat = None
        if trainer.is_global_zero:
            figure = confusion_matrix_figure(confmat)
            path = self._save(trainer, figure, self.confusion_matrix_file, "plots/confusion_matrix")
            # Rows: true class, columns: predicted class.
            np.savetxt(path.with_suffix(".csv"), confmat.numpy(), "%d", ",")

    def _save(self, trainer: L.Trainer, figure: Figure, file_name: str, tag: str) -> Path:
        path = Path(self.output_dir or trainer.default_root_dir) / file_name
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path)
        rank_zero_info(f"Saved {path}")
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_figure(tag, figure, global_step=trainer.global_step)
        return path
