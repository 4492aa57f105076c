"""The private parts of Lightning kindling relies on, for correctness no public API gives.

Each is checked when the feature that needs it first runs (not at every run's start), and a
Lightning release that changed it stops that feature with one line naming the release and the
versions kindling was tested with, instead of silently doing nothing:

- DDP under a Hydra multirun: `kindling.run.hydra_ddp.install` replaces the command that
  starts ranks 1..N-1, `_hydra_subprocess_cmd(local_rank)` of the Trainer's and Fabric's
  subprocess launchers. Lightning's own starts every rank as a run of its own folder, or the
  whole sweep again (Lightning-AI/pytorch-lightning#11300 and #15689, open fix #18175;
  facebookresearch/hydra#2070). Tested: tests/test_distributed.py.
- Mid-epoch resume: `kindling.callbacks.ResumeExactly` gives a resumed run's training loader the
  checkpoint's state and a new iterator, through `_FitLoop._combined_loader`/`_data_fetcher` and
  `CombinedLoader._load_state_dicts`: Lightning drops the loader state when the loader was made
  before the loops were restored, as a schedule reading `estimated_stepping_batches` makes it
  (Lightning-AI/pytorch-lightning#20550, open fixes #21765, #21770). Tested:
  tests/test_midepoch_resume.py.
- Epochs of the on-device loader: `kindling.data.device_loader.DeviceTensorLoader` has the fit
  loop call its sampler's `set_epoch`, through `lightning.fabric.utilities.data._set_sampler_epoch`
  (only DataLoaders get it publicly), so each epoch shuffles anew. Tested: tests/test_data.py
  (test_device_loader_shards_shuffles_and_follows_the_epoch).
- SIGTERM during validation: `kindling.callbacks.CheckpointOnInterrupt` holds the flag the loops
  stop on, `_SignalConnector.received_sigterm`, until validation ends, so a resumed run never
  skips that epoch's validation. Tested: tests/test_reliability.py.
- MFU on devices Lightning's table does not know: `kindling.callbacks.ThroughputWithMFU` sets
  `ThroughputMonitor._throughputs[...].available_flops` (callbacks=throughput only).
"""

import functools
import inspect
from collections.abc import Callable, Sequence
from types import CodeType, ModuleType

import lightning
from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
from lightning.fabric.utilities import data as fabric_data
from lightning.fabric.utilities.throughput import Throughput
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.loops import fit_loop
from lightning.pytorch.strategies.launchers import subprocess_script as pytorch_launcher
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector
from lightning.pytorch.utilities.combined_loader import CombinedLoader

from kindling.config.errors import UserError

# The releases the tests ran with: what a failing check asks to install.
SUPPORTED = "lightning>=2.6,<2.7"

RankCommand = Callable[[int], tuple[Sequence[str], str]]


def requirement(
    error: type[UserError], package: str, version: str, supported: str
) -> Callable[[bool, str], None]:
    """`require(condition, what)`: raise `error` naming `what` when `condition` is false."""

    def require(condition: bool, what: str) -> None:
        if not condition:
            raise error(
                f"kindling relies on {what}, which {package} {version} does not have. "
                f"Install a version kindling supports: pip install '{supported}'."
            )

    return require


def calls(function: Callable, name: str, *, nested: bool = False) -> bool:
    """Whether `function`'s code names `name` (a global or an attribute), so replacing it takes
    effect; with `nested`, the code of the functions and lambdas it defines counts too."""
    codes = [inspect.unwrap(function).__code__]
    while codes:
        code = codes.pop()
        if name in code.co_names:
            return True
        if nested:
            codes += [const for const in code.co_consts if isinstance(const, CodeType)]
    return False


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
