"""Epoch metrics that cost a training step a few device ops and no host-device sync.

Steps only call `update()`. The metric objects are logged once, from the epoch-end hooks:
Lightning then computes them (reduced across processes by torchmetrics), logs and resets them.
Logging a metric object costs Lightning a `Metric.to(device)` per call: logging two of them in
every step costs more than the whole step of a small model (`benchmarks/step_floor.py`).
"""

from collections.abc import Mapping

import lightning as L
from torchmetrics import MeanMetric, Metric
from torchmetrics.classification import MulticlassAccuracy


def running_mean() -> MeanMetric:
    """The mean over an epoch of every value given to `update` (give one per sample).

    The default NaN handling tests `isnan(x).any()` on the host at every update: one device sync
    per step. A NaN loss shows up as a NaN epoch mean instead, and `StopOnDivergence` stops the run.
    Without it, `update`'s `weight` is ignored (torchmetrics#3434): pass per-sample values.
    """
    return MeanMetric(nan_strategy="disable")


def accuracy(num_classes: int) -> MulticlassAccuracy:
    """Micro accuracy of predicted class ids.

    Argument validation looks at the values on the host (a sync per step); the predictions come
    from an argmax over `num_classes` logits, and cross-entropy already rejects bad targets.
    """
    return MulticlassAccuracy(num_classes, average="micro", validate_args=False)


def log_epoch_metrics(
    module: L.LightningModule, metrics: Mapping[str, Metric], prog_bar: bool = True
) -> None:
    """Log metric objects from an epoch-end hook (`on_train_epoch_end`, ...)."""
    for name, metric in metrics.items():
        module.log(name, metric, prog_bar=prog_bar)
