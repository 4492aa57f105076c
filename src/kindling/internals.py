"""The private parts of Lightning kindling relies on, for correctness no public API gives.

This module is imported, and each part checked, when the feature that needs it runs (a default
run imports it for its CSV history only): a Lightning release that changed a part stops that
feature with one line naming the release and the versions kindling was tested with, instead of
silently doing nothing.

- DDP under a Hydra multirun (`kindling.run.hydra_ddp`): the command that starts ranks 1..N-1,
  `_hydra_subprocess_cmd(local_rank)` of the Trainer's and Fabric's launchers. Lightning's own
  starts every rank as a run of its own folder, or the whole sweep again
  (Lightning-AI/pytorch-lightning#11300 and #15689, open fix #18175; facebookresearch/hydra#2070).
  Tested: tests/test_distributed.py.
- Mid-epoch resume (`callbacks/resume.py`): the training loader gets the checkpoint's
  state and a new iterator, through `_FitLoop._combined_loader`/`_data_fetcher` and
  `CombinedLoader._load_state_dicts`. Lightning drops the loader state when the loader was made
  before the loops were restored, as a schedule reading `estimated_stepping_batches` makes it
  (Lightning-AI/pytorch-lightning#20550, open fixes #21765, #21770).
  Tested: tests/test_midepoch_resume.py, tests/test_resume_world_size.py.
- Epochs of the on-device loader (`kindling.data.device_loader`): the fit loop calls the
  sampler's `set_epoch` through `lightning.fabric.utilities.data._set_sampler_epoch`, which only
  DataLoaders get publicly; without it every epoch has the first one's order.
  Tested: tests/test_data.py (test_device_loader_shards_shuffles_and_follows_the_epoch).
- MFU on the cards Lightning's table misses or misreads (`callbacks/throughput.py`):
  `ThroughputMonitor` makes its `Throughput` meters with the peak it looked up itself and takes
  none from its caller (an `available_flops` argument collides with its own), so kindling's peak
  goes to the meters in `ThroughputMonitor._throughputs` after `setup` (the table's misreadings:
  Lightning-AI/pytorch-lightning#20660, #21677).
  Tested: tests/test_train.py (test_throughput_callback_takes_the_peak_of_a_card_lightning_misses).
- SIGTERM and Ctrl-C (`callbacks/interrupt.py`): the flag the loops stop on,
  `_SignalConnector.received_sigterm`, is set by kindling on every rank at once, when the ranks
  have agreed at a step's end that one was signalled (Lightning's handler broadcasts from inside
  the signal handler and can deadlock the ranks: Lightning-AI/pytorch-lightning#20806, #20825),
  and held until validation ends, so a resumed run never skips that epoch's validation.
  Tested: tests/test_reliability.py, tests/test_hardening.py.
- Every row of an epoch on disk before its checkpoint (`callbacks/continue_metrics.py`):
  Lightning saves an epoch's checkpoints in its `on_train_epoch_end` hooks and logs the epoch's
  train values only after them, in `_FitLoop.on_advance_end`, so a kill between the two would
  lose that row for good. The row is read where Lightning will read it,
  `_LoggerConnector.metrics["log"]`, at the step `_TrainingEpochLoop._batches_that_stepped` will
  give it, and written before the checkpoint. Tested: tests/test_resume_record.py and
  tests/test_hardening.py.
"""

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

from kindling.config.errors import UserError

# The releases the tests ran with: what a failing check asks to install.
SUPPORTED = "lightning>=2.6.6,<2.7"  # as pyproject.toml pins it (tested)

RankCommand = Callable[[int], tuple[Sequence[str], str]]


class LightningInternalsChanged(UserError):
    """A private part of Lightning that kindling relies on is not what kindling expects."""


def _require(condition: bool, what: str) -> None:
    if not condition:
        raise LightningInternalsChanged(
            f"kindling relies on {what}, which lightning {lightning.__version__} does not have. "
            f"Install a version kindling supports: pip install '{SUPPORTED}'."
        )


def check_hydra_launchers() -> None:
    for module in (pytorch_launcher, fabric_launcher):
        target = f"{module.__name__}._hydra_subprocess_cmd(local_rank)"
        command = getattr(module, "_hydra_subprocess_cmd", None)
        _require(
            callable(command) and list(inspect.signature(command).parameters) == ["local_rank"],
            target,
        )
        # Replacing the module's function works only while the launcher looks it up by name.
        starts_ranks = getattr(module._SubprocessScriptLauncher, "_call_children_scripts", None)
        code = getattr(inspect.unwrap(starts_ranks), "__code__", None) if starts_ranks else None
        _require(
            code is not None and "_hydra_subprocess_cmd" in code.co_names,
            f"{target}, called by _SubprocessScriptLauncher._call_children_scripts",
        )


def install_hydra_rank_command(command: RankCommand) -> None:
    """Have Lightning's launchers (Trainer and Fabric) start extra ranks with `command`."""
    check_hydra_launchers()
    for module in (pytorch_launcher, fabric_launcher):
        module._hydra_subprocess_cmd = command


def check_sampler_epoch() -> None:
    target = "lightning.fabric.utilities.data._set_sampler_epoch(loader, epoch)"
    _require(callable(getattr(fabric_data, "_set_sampler_epoch", None)), target)


def check_training_loader(trainer: lightning.Trainer) -> None:
    for name in ("_combined_loader", "_data_fetcher"):
        _require(hasattr(trainer.fit_loop, name), f"_FitLoop.{name}")
    _require(
        callable(getattr(CombinedLoader, "_load_state_dicts", None)),
        "CombinedLoader._load_state_dicts(states)",
    )


def continue_training_loader(
    trainer: lightning.Trainer,
    states: list[dict],
    adapt: Callable[[object, dict], dict | None],
) -> bool:
    """Give the training loaders of a resumed fit the checkpoint's `states`, each as
    `adapt(loader, state)` gives it (after their epoch, which a sampler's position belongs to),
    and start a new iterator over them. Where `adapt` gives None for one of them, change
    nothing and return False."""
    check_sampler_epoch()
    check_training_loader(trainer)
    loop = trainer.fit_loop
    combined, fetcher = loop._combined_loader, loop._data_fetcher
    if combined is None or fetcher is None:
        return True
    stateful = [loader for loader in combined.flattened if isinstance(loader, _Stateful)]
    adapted = list(map(adapt, stateful, states))
    if any(state is None for state in adapted):
        return False
    for loader in combined.flattened:
        fabric_data._set_sampler_epoch(loader, loop.epoch_progress.current.processed)
    combined._load_state_dicts(adapted)
    iter(fetcher)
    return True


def check_sigterm_flag(trainer: lightning.Trainer) -> None:
    _require(
        isinstance(getattr(trainer._signal_connector, "received_sigterm", None), bool),
        "_SignalConnector.received_sigterm, read by Trainer.received_sigterm",
    )


def set_sigterm_received(trainer: lightning.Trainer, received: bool) -> None:
    """Set the flag Lightning's loops read to stop at the end of a step (and say SIGTERM came)."""
    check_sigterm_flag(trainer)
    trainer._signal_connector.received_sigterm = received


def check_throughput_meters(monitor: ThroughputMonitor) -> None:
    meters = getattr(monitor, "_throughputs", None)
    _require(
        isinstance(meters, dict) and all(isinstance(m, Throughput) for m in meters.values()),
        "ThroughputMonitor._throughputs, its Throughput meters by stage",
    )


def set_available_flops(monitor: ThroughputMonitor, flops: float) -> None:
    """Have a set-up `monitor` compute MFU over a peak of `flops` FLOP/s."""
    check_throughput_meters(monitor)
    monitor.available_flops = flops
    for meter in monitor._throughputs.values():
        meter.available_flops = flops


def check_epoch_end_row(trainer: lightning.Trainer) -> None:
    _require(
        isinstance(
            getattr(type(getattr(trainer, "_logger_connector", None)), "metrics", None), property
        ),
        "_LoggerConnector.metrics, the values the Trainer logs",
    )
    _require(
        isinstance(getattr(trainer.fit_loop.epoch_loop, "_batches_that_stepped", None), int),
        "_TrainingEpochLoop._batches_that_stepped, the step of the rows the Trainer logs",
    )
    code = getattr(inspect.unwrap(_FitLoop.on_advance_end), "__code__", None)
    names = list(code.co_names) if code else []
    _require(
        "_call_callback_hooks" in names
        and "update_train_epoch_metrics" in names
        and names.index("_call_callback_hooks") < names.index("update_train_epoch_metrics"),
        "_FitLoop.on_advance_end logging the epoch's train values after its epoch-end hooks",
    )


def epoch_end_row(trainer: lightning.Trainer) -> tuple[dict[str, float], int] | None:
    """The row the Trainer logs when the training epoch ends, and its step, while the epoch's
    end hooks (where checkpoints are saved) run before it; None at any other moment."""
    check_epoch_end_row(trainer)
    progress = trainer.fit_loop.epoch_progress.current
    if not trainer.training or progress.processed == progress.completed:
        return None
    row = convert_tensors_to_scalars(trainer._logger_connector.metrics["log"])
    if not row:
        return None  # the Trainer logs nothing
    # What `_LoggerConnector.log_metrics` adds, and the step it logs at (one less, for the epoch).
    row.setdefault("epoch", trainer.current_epoch)
    return row, trainer.fit_loop.epoch_loop._batches_that_stepped - 1
