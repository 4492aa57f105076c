"""No rank hangs, interrupts stop at a step boundary, third-party internals are checked."""

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import kindling.train
from kindling.callbacks.interrupt import CheckpointOnInterrupt

from forked import Forked
from helpers import QUIET, ROOT, importable, running, start_train_py, train_py

TWO_CPUS = ["trainer.accelerator=cpu", "trainer.devices=2"]

# A net that breaks on one rank alone: imported by `train.py` from tmp_path, not shipped.
NAN_ON_RANK_ONE = """
import os
import subprocess
import sys
import time

import torch

from kindling.models.cnn import CNNClassifier


class NaNOnRankOne(CNNClassifier):
    def __init__(self, *args, nan_at_call: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.nan_at_call, self.calls = nan_at_call, 0

    def forward(self, x):
        out = super().forward(x)
        if self.training and os.environ.get("LOCAL_RANK") == "1":
            self.calls += 1
            if self.calls >= self.nan_at_call:
                out = out * torch.nan
        return out
"""


@pytest.mark.slow
def test_a_nan_on_one_rank_stops_every_rank_with_the_divergence_message(tmp_path: Path) -> None:
    (tmp_path / "nan_on_rank_one.py").write_text(textwrap.dedent(NAN_ON_RANK_ONE))
    result = train_py(
        *TWO_CPUS, "debug=limit", "test=false", "logger=none", *QUIET,
        "callbacks.plots=null", "callbacks.device_report=null",
        "model.net._target_=nan_on_rank_one.NaNOnRankOne", "+model.net.nan_at_call=3",
        "callbacks.stop_on_divergence.check_every_n_steps=1",
        cwd=tmp_path, module_dir=tmp_path,
    )  # fmt: skip
    output = result.stdout + result.stderr
    # Rank 0 did not go on into an all-reduce that rank 1 had left.
    assert "Traceback" not in output and "RuntimeError" not in output, output[-4000:]
    assert result.returncode == 1, output[-4000:]
    # The third step's loss, NaN on rank 1 only, stopped both ranks at that step; printed once.
    assert output.count("NaN or inf at step 3 on at least one of 2 processes") == 1, output[-4000:]


# An optimizer whose k-th step is hit by Ctrl-C after the weights changed, before Lightning
# counts the step: where a real Ctrl-C can land.
CTRL_C_IN_OPTIMIZER_STEP = """
import os
import subprocess
import sys
import time
import signal

import torch


class AdamWInterrupted(torch.optim.AdamW):
    def __init__(self, params, interrupt_at_step: int, **kwargs):
        super().__init__(params, **kwargs)
        self.interrupt_at_step, self.steps = interrupt_at_step, 0

    def step(self, closure=None):
        loss = super().step(closure)
        self.steps += 1
        if self.steps == self.interrupt_at_step:
            os.kill(os.getpid(), signal.SIGINT)
        return loss
"""

REPRODUCIBLE = [
    "trainer=cpu", "trainer.deterministic=true", "seed=7", "test=false", "debug=limit",
    "logger=none", "callbacks.plots=null", "callbacks.device_report=null", *QUIET,
    # A constant learning rate: the schedule's length differs between the two runs compared.
    "model.scheduler=null",
]  # fmt: skip


@pytest.mark.slow
def test_ctrl_c_inside_an_optimizer_step_saves_the_whole_step(
    compose_config, tmp_path: Path
) -> None:
    (tmp_path / "ctrl_c_in_step.py").write_text(textwrap.dedent(CTRL_C_IN_OPTIMIZER_STEP))
    interrupted = start_train_py(
        *REPRODUCIBLE, "hydra.run.dir=interrupted",
        "model.optimizer._target_=ctrl_c_in_step.AdamWInterrupted",
        "+model.optimizer.interrupt_at_step=3",
        cwd=tmp_path, module_dir=tmp_path, ctrl_c=True,
    )  # fmt: skip
    # The same run stopped after 3 steps (before any validation: no metric to return), here
    # while the other trains: the signal is the other's, this one only sets the expected weights.
    kindling.train.run(
        compose_config(*REPRODUCIBLE, "trainer.max_steps=3", "optimized_metric=null")
    )
    output, _ = interrupted.communicate(timeout=300)
    assert interrupted.returncode == 128 + signal.SIGINT, output[-3000:]
    assert "Resume with: python train.py ckpt_path=" in output
    saved, expected = (
        torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=True)
        for run in ("interrupted", "run")
    )
    assert saved["global_step"] == expected["global_step"] == 3
    for key, tensor in expected["state_dict"].items():
        torch.testing.assert_close(saved["state_dict"][key], tensor, rtol=0, atol=0, msg=key)


def test_first_ctrl_c_waits_for_the_step_end_and_a_second_stops_at_once() -> None:
    """The first Ctrl-C asks every rank to stop at the step's end; the second raises at once."""
    trainer = SimpleNamespace(strategy=SimpleNamespace(launcher=None))
    before = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # Lightning's, in a stage
    before_ctrl_c = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        callback = CheckpointOnInterrupt()
        callback.on_train_start(trainer, None)
        os.kill(os.getpid(), signal.SIGINT)
        assert callback.stopped_by == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        callback.teardown(trainer, None, "fit")  # its watchdog stands down with the stage
        signal.signal(signal.SIGTERM, before)
        signal.signal(signal.SIGINT, before_ctrl_c)


def test_the_watchdog_ends_a_stuck_process_and_stands_down_when_the_stage_ends(
    monkeypatch,
) -> None:
    """A signalled process that never reaches a step's end exits after `exit_within_s`; one
    whose stage ended (the run stopped as it should, and the process goes on: a multirun's next
    job, a test) keeps running."""
    exits: list[int] = []
    monkeypatch.setattr(os, "_exit", exits.append)
    trainer = SimpleNamespace(strategy=SimpleNamespace(launcher=None), global_rank=0)
    before = signal.signal(signal.SIGTERM, lambda signum, frame: None)  # Lightning's, in a stage
    try:
        stuck, finished = (CheckpointOnInterrupt(exit_within_s=0.3) for _ in range(2))
        for callback in (stuck, finished):
            callback.on_train_start(trainer, None)
            os.kill(os.getpid(), signal.SIGTERM)
            signal.signal(signal.SIGTERM, lambda signum, frame: None)  # as the next stage has
        finished.teardown(trainer, None, "fit")
        time.sleep(1.5)
    finally:
        signal.signal(signal.SIGTERM, before)
    assert exits == [128 + signal.SIGTERM]  # the stuck one's, once


def break_hydra_launcher(monkeypatch) -> None:
    from lightning.pytorch.strategies.launchers import subprocess_script

    monkeypatch.delattr(subprocess_script, "_hydra_subprocess_cmd")


def change_hydra_command_signature(monkeypatch) -> None:
    from lightning.fabric.strategies.launchers import subprocess_script

    monkeypatch.setattr(subprocess_script, "_hydra_subprocess_cmd", lambda rank: ([], "."))


def stop_launcher_calling_the_command(monkeypatch) -> None:
    from lightning.pytorch.strategies.launchers import subprocess_script

    launcher = subprocess_script._SubprocessScriptLauncher
    monkeypatch.setattr(launcher, "_call_children_scripts", lambda self: None)


def break_sampler_epoch(monkeypatch) -> None:
    from lightning.fabric.utilities import data

    monkeypatch.delattr(data, "_set_sampler_epoch")


def break_training_loader(monkeypatch) -> None:
    from lightning.pytorch.utilities.combined_loader import CombinedLoader

    monkeypatch.delattr(CombinedLoader, "_load_state_dicts")


def break_sigterm_flag(monkeypatch) -> None:
    from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector

    def init(self, trainer) -> None:  # a release that keeps the flag under another name
        self.trainer, self.sigterm_received = trainer, False

    monkeypatch.setattr(_SignalConnector, "__init__", init)


def break_fit_loop(monkeypatch) -> None:
    from lightning.pytorch.loops.fit_loop import _FitLoop

    init = _FitLoop.__init__

    def renamed(self, *args, **kwargs) -> None:  # a release that names the loader otherwise
        init(self, *args, **kwargs)
        del self._combined_loader

    monkeypatch.setattr(_FitLoop, "__init__", renamed)


def break_throughput_meters(monkeypatch) -> None:
    from lightning.pytorch.callbacks import ThroughputMonitor

    init = ThroughputMonitor.__init__

    def renamed(self, *args, **kwargs) -> None:  # a release that keeps its meters otherwise
        init(self, *args, **kwargs)
        self.meters = self.__dict__.pop("_throughputs")

    monkeypatch.setattr(ThroughputMonitor, "__init__", renamed)


def break_logged_values(monkeypatch) -> None:
    from lightning.pytorch.trainer.connectors.logger_connector import _LoggerConnector

    monkeypatch.delattr(_LoggerConnector, "metrics")  # a release that reads them otherwise


def log_train_values_before_the_epoch_end_hooks(monkeypatch) -> None:
    from lightning.pytorch.loops.fit_loop import _FitLoop
    from lightning.pytorch.trainer import call

    def on_advance_end(self) -> None:  # a release that logs the row before the checkpoints
        self.trainer._logger_connector.update_train_epoch_metrics()
        call._call_callback_hooks(self.trainer, "on_train_epoch_end")

    monkeypatch.setattr(_FitLoop, "on_advance_end", on_advance_end)


BROKEN_INTERNALS = {
    "hydra command gone": (break_hydra_launcher, "_hydra_subprocess_cmd(local_rank)"),
    "hydra command signature": (change_hydra_command_signature, "_hydra_subprocess_cmd"),
    "launcher stops calling it": (stop_launcher_calling_the_command, "_call_children_scripts"),
    "sampler epoch": (break_sampler_epoch, "_set_sampler_epoch"),
    "training loader": (break_training_loader, "CombinedLoader._load_state_dicts"),
    "fit loop": (break_fit_loop, "_FitLoop._combined_loader"),
    "sigterm flag": (break_sigterm_flag, "_SignalConnector.received_sigterm"),
    "throughput meters": (break_throughput_meters, "ThroughputMonitor._throughputs"),
    "logged values": (break_logged_values, "_LoggerConnector.metrics"),
    "epoch end order": (log_train_values_before_the_epoch_end_hooks, "_FitLoop.on_advance_end"),
}


@pytest.mark.parametrize("case", BROKEN_INTERNALS)
def test_a_patch_whose_lightning_target_changed_stops_with_the_version(monkeypatch, case) -> None:
    import lightning
    from lightning.pytorch.callbacks import ThroughputMonitor

    from kindling import internals
    from kindling.callbacks.throughput import set_available_flops
    from kindling.data.resumed_loader import continue_training_loader
    from kindling.run.hydra_ddp import check_hydra_launchers

    breaks, names = BROKEN_INTERNALS[case]

    def check_all() -> None:
        trainer = lightning.Trainer(logger=False, enable_progress_bar=False)
        check_hydra_launchers()
        internals.check_sampler_epoch()
        # Each use checks first; on a Trainer that has not started, none has work to do.
        assert continue_training_loader(trainer, [])
        internals.set_sigterm_received(trainer, False)
        set_available_flops(ThroughputMonitor(batch_size_fn=len), 1.0)
        assert internals.epoch_end_row(trainer) is None

    check_all()  # the installed Lightning passes
    breaks(monkeypatch)
    with pytest.raises(internals.LightningInternalsChanged) as error:
        check_all()
    message = str(error.value)
    assert names in message and f"lightning {lightning.__version__}" in message
    assert internals.SUPPORTED in message


def test_flops_are_counted_without_copying_a_weight_on_its_device(monkeypatch) -> None:
    from lightning.fabric.utilities.throughput import measure_flops
    from torch import nn

    from kindling.callbacks.throughput import count_flops
    from kindling.models.cnn import CNNClassifier
    from kindling.modules.classifier import Classifier

    module = Classifier(CNNClassifier((1, 8, 8), 10, channels=[4, 8]), 10, optimizer=None)
    weights = {id(t) for t in (*module.parameters(), *module.buffers())}
    copied: list[str] = []
    for cls in (torch.Tensor, nn.Parameter):
        deepcopy = cls.__deepcopy__

        def recording(self, memo, deepcopy=deepcopy):
            if id(self) in weights:
                copied.append(str(self.device))
            return deepcopy(self, memo)

        monkeypatch.setattr(cls, "__deepcopy__", recording)
    flops = count_flops(module, (torch.zeros(16, 1, 8, 8), torch.zeros(16)))
    monkeypatch.undo()
    assert copied == []
    # The same count as a module built on the meta device in the first place.
    with torch.device("meta"):
        reference = Classifier(CNNClassifier((1, 8, 8), 10, channels=[4, 8]), 10, optimizer=None)
        images = torch.zeros(16, 1, 8, 8)
    expected = measure_flops(reference, lambda: reference(images), loss_fn=torch.Tensor.sum)
    assert flops == expected > 0


def first_training_labels(compose_config, seed: int, on_device: bool) -> torch.Tensor:
    """The labels of the first training batch, served as a run with `seed` serves them."""
    import lightning as L
    from hydra.utils import instantiate

    cfg = compose_config(f"seed={seed}", f"data.on_device={on_device}")
    datamodule = instantiate(cfg.data)
    datamodule.trainer = L.Trainer(accelerator="cpu", devices=1, logger=False)
    L.seed_everything(cfg.seed)  # what kindling.train.run does first
    datamodule.setup("fit")
    _, labels = next(iter(datamodule.train_dataloader()))
    return labels


@pytest.mark.parametrize("on_device", [False, True])
def test_the_runs_seed_orders_the_training_batches(compose_config, on_device: bool) -> None:
    first = first_training_labels(compose_config, 1, on_device)
    assert torch.equal(first, first_training_labels(compose_config, 1, on_device))
    assert not torch.equal(first, first_training_labels(compose_config, 2, on_device))


@pytest.mark.parametrize("on_device", [False, True])
def test_evaluation_shards_hold_every_sample_once(compose_config, on_device: bool) -> None:
    """Each rank's test loader, as 2 processes build them: 359 images, 32 per batch and rank."""
    from types import SimpleNamespace

    from hydra.utils import instantiate
    from lightning.pytorch.strategies import SingleDeviceStrategy

    served = []
    for rank in (0, 1):
        datamodule = instantiate(compose_config(f"data.on_device={on_device}").data)
        datamodule.trainer = SimpleNamespace(
            world_size=2, global_rank=rank, accelerator=None,
            strategy=SingleDeviceStrategy(torch.device("cpu")),
        )  # fmt: skip
        datamodule.setup("test")
        # Which images: the test split's labels, replaced by their positions.
        datamodule.data_test.tensors = (torch.arange(359), torch.arange(359))
        served += [labels for _, labels in datamodule.test_dataloader()]
    assert torch.equal(torch.cat(served).sort().values, torch.arange(359))


# Sends a signal at a chosen moment of a run of several processes: imported by `train.py` from
# tmp_path, not shipped. Each rank signals itself, as a cluster signals every task.
SIGNAL_AT = """
import functools
import os
import subprocess
import sys
import time
import signal
import threading
import time
from pathlib import Path

import lightning as L


class SignalAt(L.Callback):
    def __init__(self, pid_dir, hook=None, step=0, ranks=(0, 1), sig="SIGTERM", delay=0.0,
                 stall_rank=None, stall_s=0.0):
        self.pid_dir, self.step, self.ranks, self.sig = pid_dir, step, ranks, sig
        self.delay, self.stall_rank, self.stall_s, self.fired = delay, stall_rank, stall_s, False
        if hook:
            setattr(self, hook, self.fire)

    def setup(self, trainer, module, stage):
        Path(self.pid_dir, str(trainer.global_rank)).write_text(str(os.getpid()))

    def fire(self, trainer, *args):
        if self.fired or trainer.sanity_checking or trainer.global_step != self.step:
            return
        self.fired = True
        if trainer.global_rank in self.ranks:
            kill = functools.partial(os.kill, os.getpid(), getattr(signal, self.sig))
            threading.Timer(self.delay, kill).start() if self.delay else kill()
        if trainer.global_rank == self.stall_rank:
            time.sleep(self.stall_s)
"""

# 2 processes, 5 steps an epoch: epoch 1 is steps 5 to 9, after the first epoch's checkpoint.
STORM = {
    "every rank, inside an optimizer step": ("hook=on_before_optimizer_step", "step=6"),
    # Rank 0 waits at the step's end while rank 1 waits for it in the next step's broadcast of
    # the SIGTERM flag: rank 1's signal lands there.
    "rank 1 alone, inside the step-boundary broadcast": (
        "hook=on_train_batch_end", "step=7", "ranks=[1]", "delay=0.5", "stall_rank=0",
        "stall_s=2",
    ),
    "the launching process alone, at an epoch's end": (
        "hook=on_train_epoch_end", "step=10", "ranks=[0]",
    ),
    "every rank, in validation": ("hook=on_validation_batch_start", "step=10"),
    "every rank, while a checkpoint is written": ("hook=on_save_checkpoint", "step=5"),
    "Ctrl-C on every rank": ("hook=on_train_batch_start", "step=6", "sig=SIGINT"),
    # Rank 1 never reaches the end of its step: rank 0 waits for it, until the watchdog.
    "a rank that never reaches the end of its step": (
        "hook=on_train_batch_start", "step=6", "stall_rank=1", "stall_s=600",
    ),
    "every rank, from outside, at a random moment": (),
}  # fmt: skip


@pytest.mark.slow
def test_a_signal_at_any_moment_ends_every_rank_of_a_two_process_run(tmp_path: Path) -> None:
    import random

    (tmp_path / "signal_at.py").write_text(textwrap.dedent(SIGNAL_AT))
    runs = {}
    for number, (case, hook_args) in enumerate(STORM.items()):
        pid_dir = tmp_path / f"pids{number}"
        pid_dir.mkdir()
        args = [
            *TWO_CPUS, "debug=limit", "trainer.max_epochs=4", "test=false", "logger=none",
            *QUIET, "callbacks.plots=null", "callbacks.device_report=null",
            "interrupt.exit_within_s=10", f"hydra.run.dir=run{number}",
            "+callbacks.signal_at._target_=signal_at.SignalAt",
            f"+callbacks.signal_at.pid_dir={pid_dir}",
            *(f"+callbacks.signal_at.{arg}" for arg in hook_args),
            # The random moment falls in training: it is up to a second after the first
            # epoch's checkpoint, and 4 epochs of 5 steps can all be over by then.
            *([] if hook_args else ["trainer.max_epochs=40"]),
        ]  # fmt: skip
        process = start_train_py(*args, cwd=tmp_path, module_dir=tmp_path, ctrl_c=True)
        runs[case] = process, pid_dir, tmp_path / f"run{number}" / "checkpoints"
    process, pid_dir, checkpoints = runs["every rank, from outside, at a random moment"]
    deadline = time.monotonic() + 240
    while not list(checkpoints.glob("epoch_*.ckpt")) and process.poll() is None:
        time.sleep(0.1)
    time.sleep(random.uniform(0, 1))
    for pid_file in pid_dir.iterdir():
        os.kill(int(pid_file.read_text()), signal.SIGTERM)

    outputs, hung = {}, []
    for case, (process, _, _) in runs.items():
        try:
            outputs[case] = process.communicate(timeout=max(1, deadline - time.monotonic()))[0]
        except subprocess.TimeoutExpired:
            hung.append(case)
    pids = {
        case: [int(f.read_text()) for f in pid_dir.iterdir()]
        for case, (_, pid_dir, _) in runs.items()
    }
    for pid in [pid for case in pids for pid in pids[case] if running(pid)]:
        os.kill(pid, signal.SIGKILL)
    assert not hung, f"still running 240 s after starting: {hung}"
    for case, (process, _, checkpoints) in runs.items():
        output = outputs[case][-3000:]
        assert len(pids[case]) == 2 and not any(map(running, pids[case])), (case, output)
        if case == "a rank that never reaches the end of its step":
            assert process.returncode == 143, (case, output)
            assert "did not stop within 10 s of SIGTERM" in output, (case, output)
            continue
        assert process.returncode == (130 if "Ctrl-C" in case else 143), (case, output)
        assert "Interrupted at epoch" in output, (case, output)
        checkpoint = torch.load(checkpoints / "last.ckpt", weights_only=True)
        assert checkpoint["global_step"] > 0, case

    # Resumed, one of them trains to the end.
    _, _, checkpoints = runs["rank 1 alone, inside the step-boundary broadcast"]
    resumed = train_py(
        *TWO_CPUS, "debug=limit", "trainer.max_epochs=4", "test=false", "logger=none",
        *QUIET, "callbacks.plots=null", "callbacks.device_report=null",
        f"ckpt_path={checkpoints / 'last.ckpt'}", cwd=tmp_path, timeout=120,
    )  # fmt: skip
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    assert torch.load(checkpoints / "last.ckpt", weights_only=True)["global_step"] == 20


def test_the_lightning_kindling_asks_for_is_the_one_it_was_tested_with() -> None:
    """What a failing internals check asks to install is what pyproject.toml pins."""
    from importlib.metadata import requires

    from packaging.requirements import Requirement

    from kindling import internals

    (lightning,) = [r for r in map(Requirement, requires("kindling")) if r.name == "lightning"]
    assert lightning == Requirement(internals.SUPPORTED)


@pytest.mark.slow
def test_a_sigterm_between_stages_ends_the_run_with_143_and_says_so(tmp_path: Path) -> None:
    (tmp_path / "signal_at.py").write_text(textwrap.dedent(SIGNAL_AT))
    (tmp_path / "pids").mkdir()
    # At the end of fit (5 steps): training is over, testing not begun.
    result = train_py(
        "trainer=cpu", "debug=limit", "trainer.max_epochs=1", *QUIET,
        "+callbacks.signal_at._target_=signal_at.SignalAt", "+callbacks.signal_at.hook=on_fit_end",
        "+callbacks.signal_at.step=5", f"+callbacks.signal_at.pid_dir={tmp_path / 'pids'}",
        cwd=tmp_path, module_dir=tmp_path,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 143, output[-3000:]
    assert "Stopped by SIGTERM outside training: nothing more was saved." in output
    assert "Test metric" not in output  # it stopped there


@pytest.mark.slow
@pytest.mark.parametrize(
    ("hook", "step"), [("on_train_batch_start", 4), ("on_validation_batch_start", 5)],
    ids=["in the last step", "in the last validation"],
)  # fmt: skip
def test_ctrl_c_as_training_ends_saves_the_finished_training_and_does_not_test(
    tmp_path: Path, hook: str, step: int
) -> None:
    """Not a resume line (a resume would be refused: nothing is left to train), nor a test."""
    (tmp_path / "signal_at.py").write_text(textwrap.dedent(SIGNAL_AT))
    (tmp_path / "pids").mkdir()
    # A one-epoch run of 5 steps.
    process = start_train_py(
        "trainer=cpu", "debug=limit", "trainer.max_epochs=1", *QUIET,
        "+callbacks.signal_at._target_=signal_at.SignalAt",
        f"+callbacks.signal_at.hook={hook}", f"+callbacks.signal_at.step={step}",
        "+callbacks.signal_at.sig=SIGINT", f"+callbacks.signal_at.pid_dir={tmp_path / 'pids'}",
        cwd=tmp_path, module_dir=tmp_path, ctrl_c=True,
    )  # fmt: skip
    output = process.communicate(timeout=300)[0]
    assert process.returncode == 130, output[-3000:]
    assert "Stopped by Ctrl-C as training ended: it is complete" in output, output[-3000:]
    assert "Test it with: python train.py train=false ckpt_path=" in output
    assert "Resume with" not in output and "Test metric" not in output
    (checkpoint,) = tmp_path.glob("logs/debug/runs/*/checkpoints/last.ckpt")
    assert torch.load(checkpoint, weights_only=True)["global_step"] == 5


STALL_AT = """
import time
from pathlib import Path
import lightning as L

class StallAt(L.Callback):
    # At step `step`, names the moment in <folder>/at_step and waits for the signal (30 s at
    # most): it lands then, with the loader's workers running.
    def __init__(self, step, folder):
        self.step, self.folder = step, folder

    def on_train_batch_start(self, trainer, *args):
        if trainer.global_step == self.step:
            Path(self.folder, "at_step").write_text(str(self.step))
            deadline = time.monotonic() + 30
            while not self.signalled(trainer) and time.monotonic() < deadline:
                time.sleep(0.05)

    def signalled(self, trainer):  # kindling's handler raises its flag; the step ends later
        return any(getattr(c, "stopped_by", None) for c in trainer.callbacks)
"""


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "Ctrl-C"])
def test_a_signal_to_the_whole_process_group_with_loader_workers_saves_the_step(
    tmp_path: Path, signum: signal.Signals
) -> None:
    """A terminal's Ctrl-C and SLURM's scancel signal every process of the group, the loader's
    workers too: they leave it to the main process, which saves at the end of the step."""
    (tmp_path / "stall_at.py").write_text(textwrap.dedent(STALL_AT))
    args = [
        "trainer=cpu", "data.num_workers=2", "trainer.max_epochs=5", *QUIET,
        "callbacks.plots=null", "+callbacks.stall_at._target_=stall_at.StallAt",
        "+callbacks.stall_at.step=3", f"+callbacks.stall_at.folder={tmp_path}",
    ]  # fmt: skip
    process = Forked(
        ROOT / "train.py", args, cwd=tmp_path, env=importable(tmp_path), module_dir=tmp_path,
        merge_stderr=True, ctrl_c=True, new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not (tmp_path / "at_step").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()[0]
        time.sleep(0.1)
    os.killpg(process.pid, signum)
    output = process.communicate(timeout=120)[0]
    assert process.returncode == 128 + signum, output[-3000:]
    assert "Interrupted at epoch 0, step 4." in output, output[-3000:]
    (checkpoint,) = tmp_path.glob("logs/train/runs/*/checkpoints/last.ckpt")
    assert torch.load(checkpoint, weights_only=True)["global_step"] == 4


# Counts the torch.distributed calls kindling's own code makes in each training step (from one
# batch's start to the next's, in one epoch), by whether they block and which group they use:
# imported by `train.py` from tmp_path, not shipped.
COUNT_COLLECTIVES = """
import json
import os
import re
import signal
import traceback
from pathlib import Path

import lightning as L
import torch.distributed as dist

import kindling

KINDLING = str(Path(kindling.__file__).parent)
LIGHTNING_CALLS = re.compile(r"lightning/pytorch/(loops/|trainer/call\\.py)")
NAMES = ("all_reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce", "gather",
         "scatter", "reduce_scatter", "all_to_all", "barrier", "all_gather_object",
         "broadcast_object_list", "gather_object", "scatter_object_list", "send", "recv")


class CountCollectives(L.Callback):
    def __init__(self, folder, signal_rank_1_at_step):
        self.folder, self.signal_at = folder, signal_rank_1_at_step
        self.calls, self.steps, self.mark = [], [], None

    def setup(self, trainer, module, stage):
        for name in NAMES:
            setattr(dist, name, self.counting(name, getattr(dist, name)))

    def counting(self, name, collective):
        def counted(*args, **kwargs):
            # Kindling's: a frame of kindling's below Lightning's loops and hook calls.
            for frame in reversed(traceback.extract_stack()[:-1]):
                if frame.filename.startswith(KINDLING):
                    group = kwargs.get("group")
                    world = group is None or group is dist.group.WORLD
                    where = f"{frame.filename[len(KINDLING):]}:{frame.lineno} {frame.name}"
                    self.calls.append((name, not kwargs.get("async_op", False), world, where))
                    break
                if LIGHTNING_CALLS.search(frame.filename):
                    break
            return collective(*args, **kwargs)
        return counted

    def on_train_batch_start(self, trainer, module, batch, batch_idx):
        if self.mark is not None and batch_idx > 0:
            self.steps.append(self.calls[self.mark:])
        self.mark = len(self.calls)
        if trainer.global_rank == 1 and trainer.global_step == self.signal_at:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_exception(self, trainer, module, exception):
        Path(self.folder, str(trainer.global_rank)).write_text(json.dumps(self.steps))
"""


@pytest.mark.slow
def test_a_training_step_of_two_processes_holds_no_collective_of_kindlings_that_blocks(
    tmp_path: Path,
) -> None:
    """Every default callback on: kindling adds no blocking collective, and none on the
    training's group, to a step; its one vote (whether a rank was signalled) runs in the
    background. A SIGTERM to one rank in step n still stops every rank by the end of step n + 1."""
    (tmp_path / "count_collectives.py").write_text(textwrap.dedent(COUNT_COLLECTIVES))
    result = train_py(
        *TWO_CPUS, "data.batch_size=16", "trainer.max_epochs=3", "trainer.limit_train_batches=20",
        "trainer.limit_val_batches=2", "trainer.limit_test_batches=2", "logger=csv",
        "+callbacks.count._target_=count_collectives.CountCollectives",
        f"+callbacks.count.folder={tmp_path}", "+callbacks.count.signal_rank_1_at_step=30",
        cwd=tmp_path, module_dir=tmp_path,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 143, output[-3000:]
    for rank in (0, 1):
        steps = json.loads((tmp_path / str(rank)).read_text())
        assert len(steps) >= 25, rank  # 19 in the first epoch, 10 in the second
        blocking = [call for step in steps for call in step if call[1] or call[2]]
        assert blocking == [], (rank, blocking[:5])
        assert all(len(step) <= 1 for step in steps), (rank, steps)  # the vote, or nothing
    (checkpoint,) = tmp_path.glob("logs/train/runs/*/checkpoints/last.ckpt")
    assert torch.load(checkpoint, weights_only=True)["global_step"] in (31, 32)


@pytest.mark.slow
def test_ctrl_c_while_the_run_starts_is_one_line_and_exit_130(tmp_path: Path) -> None:
    """Ctrl-C before training (here while the task imports torch; composing is the same): one
    line, the exit status of an interrupt, no traceback."""
    import sys

    process = subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *QUIET], cwd=tmp_path, text=True,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, preexec_fn=lambda: signal.signal(
            signal.SIGINT, signal.default_int_handler),  # as in a terminal, not a background job
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not list(tmp_path.glob("logs/train/runs/*/.hydra")):  # the task starts: imports torch
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    output = process.communicate(timeout=60)[0]
    assert process.returncode == 130, output[-3000:]
    assert output.strip().splitlines()[-1] == "Stopped by Ctrl-C.", output[-3000:]
    assert "Traceback" not in output, output[-3000:]
