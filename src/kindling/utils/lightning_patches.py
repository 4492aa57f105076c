"""Every place kindling relies on a private part of Lightning, each checked before it is used.

- `kindling.utils.hydra_ddp.install` replaces the command that starts ranks 1..N-1 under Hydra:
  `_hydra_subprocess_cmd(local_rank)` of the Trainer's and Fabric's subprocess launchers, which
  they look up by name when they start the ranks.
- `kindling.callbacks.ThroughputWithMFU` sets the peak FLOPs of a device Lightning's table does
  not know: `ThroughputMonitor._throughputs`, the `Throughput` of each stage made in `setup`.
- `kindling.data.device_loader.DeviceTensorLoader` has Lightning call its `set_epoch` although it
  is not a DataLoader: `lightning.fabric.utilities.data._set_sampler_epoch`, which the fit loop
  calls with each loader and which calls `loader.sampler.set_epoch(epoch)`.
- `kindling.callbacks.CheckpointOnInterrupt` holds a SIGTERM that arrives during validation until
  validation ends: `_SignalConnector.received_sigterm`, the flag Lightning's loops stop on.
- `kindling.callbacks.ResumeExactly` gives a resumed run's training loader the checkpoint's state
  and a new iterator: `_FitLoop._combined_loader` and `_data_fetcher`, made in `setup_data`, and
  `CombinedLoader._load_state_dicts(states)`.
- `install_prompt_progress_stop` has `RichProgressBar` stop at once at the end of fit and test:
  its drawing thread, `rich_progress._RefreshThread` (made by `CustomProgress.start`), sleeps
  1/refresh_rate s between draws, and stopping the bar waits for that sleep to end.

A Lightning release that renames any of these would make the patch do nothing, silently: every
DDP rank would start the whole sweep again, MFU would be missing, each epoch would shuffle the
same way. So each check stops the run with one message naming the Lightning version instead.
`pyproject.toml` bounds Lightning to the minor version the tests were run with (2.6.6).
"""

import functools
import inspect
from collections.abc import Callable, Sequence
from types import ModuleType

import lightning
from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
from lightning.fabric.utilities import data as fabric_data
from lightning.fabric.utilities.throughput import Throughput
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.callbacks.progress import rich_progress
from lightning.pytorch.loops import fit_loop
from lightning.pytorch.strategies.launchers import subprocess_script as pytorch_launcher
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector
from lightning.pytorch.utilities.combined_loader import CombinedLoader

from kindling.utils.errors import UserError
from kindling.utils.internals import calls, requirement

# The minor version the tests ran with; keep in step with `lightning` in pyproject.toml.
SUPPORTED = "lightning>=2.6,<2.7"

RankCommand = Callable[[int], tuple[Sequence[str], str]]


class LightningInternalsChanged(UserError):
    """A private part of Lightning that kindling patches is not what kindling expects."""


_require = requirement(LightningInternalsChanged, "lightning", lightning.__version__, SUPPORTED)


@functools.cache
def check_hydra_launchers() -> None:
    for module in (pytorch_launcher, fabric_launcher):
        target = f"{module.__name__}._hydra_subprocess_cmd(local_rank)"
        command = getattr(module, "_hydra_subprocess_cmd", None)
        _require(
            callable(command) and list(inspect.signature(command).parameters) == ["local_rank"],
            target,
        )
        launcher = getattr(module, "_SubprocessScriptLauncher", None)
        starts_ranks = getattr(launcher, "_call_children_scripts", None)
        _require(
            starts_ranks is not None and calls(starts_ranks, "_hydra_subprocess_cmd"),
            f"{target}, called by _SubprocessScriptLauncher._call_children_scripts",
        )


def install_hydra_rank_command(command: RankCommand) -> None:
    """Have Lightning's launchers (Trainer and Fabric) start extra ranks with `command`."""
    check_hydra_launchers()
    modules: tuple[ModuleType, ...] = (pytorch_launcher, fabric_launcher)
    for module in modules:
        module._hydra_subprocess_cmd = command


@functools.cache
def check_throughput_monitor() -> None:
    monitor = ThroughputMonitor(batch_size_fn=len)
    _require(
        isinstance(getattr(monitor, "_throughputs", None), dict)
        and calls(ThroughputMonitor.setup, "_throughputs"),
        "ThroughputMonitor._throughputs, the Throughput of each stage made in setup()",
    )
    _require(
        hasattr(Throughput(available_flops=None), "available_flops"),
        "Throughput.available_flops",
    )


def set_available_flops(monitor: ThroughputMonitor, flops: int) -> None:
    """Peak FLOPs per device for `monitor`, after its `setup` made the stages' meters."""
    check_throughput_monitor()
    monitor.available_flops = flops
    for throughput in monitor._throughputs.values():
        throughput.available_flops = flops


@functools.cache
def check_sampler_epoch() -> None:
    set_sampler_epoch = getattr(fabric_data, "_set_sampler_epoch", None)
    target = "lightning.fabric.utilities.data._set_sampler_epoch(loader, epoch)"
    _require(callable(set_sampler_epoch), target)
    _require(
        calls(fit_loop._FitLoop.on_advance_start, "_set_sampler_epoch"),
        f"{target}, called by the fit loop at the start of every epoch",
    )

    class Loader:  # the protocol DeviceTensorLoader follows: `loader.sampler.set_epoch(epoch)`
        def __init__(self) -> None:
            self.sampler, self.batch_sampler, self.epoch = self, None, None

        def set_epoch(self, epoch: int) -> None:
            self.epoch = epoch

    loader = Loader()
    set_sampler_epoch(loader, 3)
    _require(loader.epoch == 3, f"{target} calling `loader.sampler.set_epoch(epoch)`")


@functools.cache
def check_training_loader() -> None:
    setup_data = fit_loop._FitLoop.setup_data
    for name in ("_combined_loader", "_data_fetcher"):
        _require(calls(setup_data, name), f"_FitLoop.{name}, set by _FitLoop.setup_data")
    _require(
        callable(getattr(CombinedLoader, "_load_state_dicts", None)),
        "CombinedLoader._load_state_dicts(states)",
    )


def continue_training_loader(trainer: lightning.Trainer, states: list[dict]) -> None:
    """Give the training loaders of a resumed fit the checkpoint's `states` (after their
    epoch, which a sampler's position belongs to) and start a new iterator over them."""
    check_sampler_epoch()
    check_training_loader()
    check_sigterm_flag()
    loop = trainer.fit_loop
    combined, fetcher = loop._combined_loader, loop._data_fetcher
    if combined is None or fetcher is None:
        return
    for loader in combined.flattened:
        fabric_data._set_sampler_epoch(loader, loop.epoch_progress.current.processed)
    combined._load_state_dicts(states)
    iter(fetcher)


@functools.cache
def check_sigterm_flag() -> None:
    _require(
        calls(_SignalConnector.__init__, "received_sigterm")
        and isinstance(inspect.getattr_static(lightning.Trainer, "received_sigterm"), property),
        "_SignalConnector.received_sigterm, read by Trainer.received_sigterm",
    )


def set_sigterm_received(trainer: lightning.Trainer, received: bool) -> None:
    """Set the flag Lightning's loops read to stop at the end of a step (and say SIGTERM came)."""
    check_sigterm_flag()
    trainer._signal_connector.received_sigterm = received


@functools.cache
def check_progress_refresh_thread() -> None:
    thread = getattr(rich_progress, "_RefreshThread", None)
    _require(
        thread is not None
        and calls(rich_progress.CustomProgress.start, "_RefreshThread")
        and {"refresh_cond", "live", "done"} <= set(_PromptRefreshThread(None, 1).__dict__),
        "rich_progress._RefreshThread(live, refresh_per_second), made by CustomProgress.start",
    )


class _PromptRefreshThread(getattr(rich_progress, "_RefreshThread", object)):  # type: ignore[misc]
    """Lightning's drawing thread of the rich progress bar (it draws only when the bar asked for
    it, `refresh_cond`), waiting on its stop event instead of sleeping, so that it ends as soon
    as the bar stops."""

    def run(self) -> None:
        while not self.done.wait(1 / self.refresh_per_second):
            if self.refresh_cond:
                with self.live._lock:
                    self.live.refresh()
                self.refresh_cond = False


def install_prompt_progress_stop() -> None:
    """Have every RichProgressBar stop without waiting up to 1/refresh_rate s (twice a run)."""
    check_progress_refresh_thread()
    rich_progress._RefreshThread = _PromptRefreshThread


def check_all() -> None:
    """Every check above: the run stops before any work if one fails."""
    check_hydra_launchers()
    check_throughput_monitor()
    check_sampler_epoch()
    check_training_loader()
    check_sigterm_flag()
    check_progress_refresh_thread()
