"""The private parts of Lightning kindling relies on, for correctness no public API gives; each
is checked when its feature runs, and a changed one stops that feature in one line naming the
versions kindling was tested with (tests/test_hardening.py). Here are the check and the parts a
default run uses; those of other features sit with them: DDP under Hydra (run/hydra_ddp.py), a
resumed fit's training loader (data/resumed_loader.py), peak FLOPs (callbacks/throughput.py).
Upstream issues of Lightning-AI/
pytorch-lightning: DDP under Hydra #11300, #15689 (hydra#2070); loader state dropped #20550;
peak FLOPs misread #20660, #21677; SIGTERM broadcast inside the handler deadlocks #20806."""

import inspect
from collections.abc import Callable

import lightning
from lightning.fabric.utilities import data as fabric_data
from lightning.fabric.utilities.apply_func import convert_tensors_to_scalars
from lightning.pytorch.loops.fit_loop import _FitLoop

from kindling.errors import UserError

SUPPORTED = "lightning>=2.6.6,<2.7"  # as pyproject.toml pins it (tested)


class LightningInternalsChanged(UserError):
    """A private part of Lightning that kindling relies on is not what kindling expects."""


def require(condition: bool, what: str) -> None:
    if not condition:
        raise LightningInternalsChanged(
            f"kindling relies on {what}, which lightning {lightning.__version__} does not have. "
            f"Install a version kindling supports: pip install '{SUPPORTED}'."
        )


def code_names(function: Callable | None) -> list[str]:
    """The global and attribute names `function`'s code uses."""
    code = getattr(inspect.unwrap(function), "__code__", None) if function else None
    return list(code.co_names) if code else []


def check_sampler_epoch() -> None:
    setter = getattr(fabric_data, "_set_sampler_epoch", None)
    require(callable(setter), "lightning.fabric.utilities.data._set_sampler_epoch")


def set_sigterm_received(trainer: lightning.Trainer, received: bool) -> None:
    """Set the flag Lightning's loops stop on at the end of a step."""
    flag = getattr(trainer._signal_connector, "received_sigterm", None)
    require(isinstance(flag, bool), "_SignalConnector.received_sigterm")
    trainer._signal_connector.received_sigterm = received


def epoch_end_row(trainer: lightning.Trainer) -> tuple[dict[str, float], int] | None:
    """The row, and its step, the Trainer logs when the training epoch ends, after the epoch's
    end hooks (checkpoints); None at any other moment or when it logs nothing."""
    connector = type(getattr(trainer, "_logger_connector", None))
    require(isinstance(getattr(connector, "metrics", None), property), "_LoggerConnector.metrics")
    step = getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", None)
    require(isinstance(step, int), "_TrainingEpochLoop._batches_that_stepped")
    names, row = code_names(_FitLoop.on_advance_end), "update_train_epoch_metrics"
    hooks_first = row in names and "_call_callback_hooks" in names[: names.index(row)]
    require(hooks_first, "_FitLoop.on_advance_end logging the train row after the epoch's hooks")
    progress = trainer.fit_loop.epoch_progress.current
    if not trainer.training or progress.processed == progress.completed:
        return None
    row = convert_tensors_to_scalars(trainer._logger_connector.metrics["log"])
    if not row:
        return None
    row.setdefault("epoch", trainer.current_epoch)  # as `_LoggerConnector.log_metrics` adds it
    return row, trainer.fit_loop.epoch_loop._batches_that_stepped - 1
