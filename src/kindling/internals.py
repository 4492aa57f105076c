"""The private parts of Lightning kindling relies on, for correctness no public API gives; each
is checked when its feature runs, and a changed one stops that feature in one line naming the
versions kindling was tested with (tests/test_hardening.py). Upstream issues of Lightning-AI/
pytorch-lightning: DDP under Hydra #11300, #15689 (hydra#2070); loader state dropped #20550;
peak FLOPs misread #20660, #21677; SIGTERM broadcast inside the handler deadlocks #20806."""

import inspect
from collections.abc import Callable, Sequence

import lightning
from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
from lightning.fabric.utilities import data as fabric_data
from lightning.fabric.utilities.apply_func import convert_tensors_to_scalars
from lightning.fabric.utilities.throughput import Throughput
from lightning.fabric.utilities.types import _Stateful
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.loops.fit_loop import _FitLoop
from lightning.pytorch.strategies.launchers import subprocess_script as pytorch_launcher
from lightning.pytorch.utilities.combined_loader import CombinedLoader

from kindling.errors import UserError

SUPPORTED = "lightning>=2.6.6,<2.7"  # as pyproject.toml pins it (tested)


class LightningInternalsChanged(UserError):
    """A private part of Lightning that kindling relies on is not what kindling expects."""


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise LightningInternalsChanged(
            f"kindling relies on {what}, which lightning {lightning.__version__} does not have. "
            f"Install a version kindling supports: pip install '{SUPPORTED}'."
        )


def _names(function: Callable | None) -> list[str]:
    """The global and attribute names `function`'s code uses."""
    code = getattr(inspect.unwrap(function), "__code__", None) if function else None
    return list(code.co_names) if code else []


def check_hydra_launchers() -> None:
    for module in (pytorch_launcher, fabric_launcher):
        target = f"{module.__name__}._hydra_subprocess_cmd(local_rank)"
        command = getattr(module, "_hydra_subprocess_cmd", None)
        arguments = [*inspect.signature(command).parameters] if callable(command) else None
        _require(arguments == ["local_rank"], target)
        # Replacing the function works only while the launcher looks it up by name.
        starts = getattr(module._SubprocessScriptLauncher, "_call_children_scripts", None)
        caller = "_SubprocessScriptLauncher._call_children_scripts"
        _require("_hydra_subprocess_cmd" in _names(starts), f"{target}, called by {caller}")


def install_hydra_rank_command(command: Callable[[int], tuple[Sequence[str], str]]) -> None:
    """Have Lightning's launchers (Trainer and Fabric) start extra ranks with `command`."""
    check_hydra_launchers()
    for module in (pytorch_launcher, fabric_launcher):
        module._hydra_subprocess_cmd = command


def check_sampler_epoch() -> None:
    setter = getattr(fabric_data, "_set_sampler_epoch", None)
    _require(callable(setter), "lightning.fabric.utilities.data._set_sampler_epoch")


def continue_training_loader(
    trainer: lightning.Trainer, states: list[dict], adapt: Callable[[object, dict], dict | None]
) -> bool:
    """Give the training loaders of a resumed fit their epoch, the checkpoint's `states` (as
    `adapt(loader, state)` gives them; False, nothing done, where it gives None) and a new
    iterator."""
    check_sampler_epoch()
    for name in ("_combined_loader", "_data_fetcher"):
        _require(hasattr(trainer.fit_loop, name), f"_FitLoop.{name}")
    load = getattr(CombinedLoader, "_load_state_dicts", None)
    _require(callable(load), "CombinedLoader._load_state_dicts(states)")
    loop = trainer.fit_loop
    combined, fetcher = loop._combined_loader, loop._data_fetcher
    if combined is None or fetcher is None:
        return True
    stateful = [loader for loader in combined.flattened if isinstance(loader, _Stateful)]
    adapted = list(map(adapt, stateful, states))
    if None in adapted:
        return False
    for loader in combined.flattened:
        fabric_data._set_sampler_epoch(loader, loop.epoch_progress.current.processed)
    combined._load_state_dicts(adapted)
    iter(fetcher)
    return True


def set_sigterm_received(trainer: lightning.Trainer, received: bool) -> None:
    """Set the flag Lightning's loops stop on at the end of a step."""
    flag = getattr(trainer._signal_connector, "received_sigterm", None)
    _require(isinstance(flag, bool), "_SignalConnector.received_sigterm")
    trainer._signal_connector.received_sigterm = received


def set_available_flops(monitor: ThroughputMonitor, flops: float) -> None:
    """Have a set-up `monitor` compute MFU over a peak of `flops` FLOP/s."""
    meters = getattr(monitor, "_throughputs", None)
    meters_ok = isinstance(meters, dict) and all(isinstance(m, Throughput) for m in meters.values())
    _require(meters_ok, "ThroughputMonitor._throughputs")
    monitor.available_flops = flops
    for meter in meters.values():
        meter.available_flops = flops


def epoch_end_row(trainer: lightning.Trainer) -> tuple[dict[str, float], int] | None:
    """The row, and its step, the Trainer logs when the training epoch ends, after the epoch's
    end hooks (checkpoints); None at any other moment or when it logs nothing."""
    connector = type(getattr(trainer, "_logger_connector", None))
    _require(isinstance(getattr(connector, "metrics", None), property), "_LoggerConnector.metrics")
    step = getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", None)
    _require(isinstance(step, int), "_TrainingEpochLoop._batches_that_stepped")
    names, row = _names(_FitLoop.on_advance_end), "update_train_epoch_metrics"
    hooks_first = row in names and "_call_callback_hooks" in names[: names.index(row)]
    _require(hooks_first, "_FitLoop.on_advance_end logging the train row after the epoch's hooks")
    progress = trainer.fit_loop.epoch_progress.current
    if not trainer.training or progress.processed == progress.completed:
        return None
    row = convert_tensors_to_scalars(trainer._logger_connector.metrics["log"])
    if not row:
        return None
    row.setdefault("epoch", trainer.current_epoch)  # as `_LoggerConnector.log_metrics` adds it
    return row, trainer.fit_loop.epoch_loop._batches_that_stepped - 1
