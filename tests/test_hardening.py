"""No rank hangs, interrupts stop at a step boundary, third-party internals are checked."""

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from kindling.callbacks import CheckpointOnInterrupt

from conftest import ROOT

QUIET = ["callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null"]
TWO_CPUS = ["trainer.accelerator=cpu", "trainer.devices=2"]

# A net that breaks on one rank alone: imported by `train.py` from tmp_path, not shipped.
NAN_ON_RANK_ONE = """
import os

import torch

from kindling.models import CNNClassifier


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


def train_py_with(module_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python train.py <args>` with `module_dir` importable (ranks inherit the environment)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(module_dir), env.get("PYTHONPATH")]))
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_a_nan_on_one_rank_stops_every_rank_with_the_divergence_message(tmp_path: Path) -> None:
    (tmp_path / "nan_on_rank_one.py").write_text(textwrap.dedent(NAN_ON_RANK_ONE))
    result = train_py_with(
        tmp_path, *TWO_CPUS, "debug=limit", "test=false", "logger=none", *QUIET,
        "callbacks.plots=null", "callbacks.device_report=null",
        "model.net._target_=nan_on_rank_one.NaNOnRankOne", "+model.net.nan_at_call=3",
        "callbacks.stop_on_divergence.check_every_n_steps=1",
        cwd=tmp_path,
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
]  # fmt: skip


def start_train_py(module_dir: Path, *args: str, cwd: Path) -> subprocess.Popen:
    """`python train.py <args>` with `module_dir` importable and Ctrl-C as in a terminal."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(module_dir), env.get("PYTHONPATH")]))
    # A shell starts background jobs (CI) with SIGINT ignored; a terminal's run has it.
    return subprocess.Popen(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip


@pytest.mark.slow
def test_ctrl_c_inside_an_optimizer_step_saves_the_whole_step(tmp_path: Path) -> None:
    (tmp_path / "ctrl_c_in_step.py").write_text(textwrap.dedent(CTRL_C_IN_OPTIMIZER_STEP))
    interrupted = start_train_py(
        tmp_path, *REPRODUCIBLE, "hydra.run.dir=interrupted",
        "model.optimizer._target_=ctrl_c_in_step.AdamWInterrupted",
        "+model.optimizer.interrupt_at_step=3",
        cwd=tmp_path,
    )  # fmt: skip
    # The same run stopped after 3 steps (before any validation: no metric to return).
    straight = start_train_py(
        tmp_path, *REPRODUCIBLE, "hydra.run.dir=straight", "+trainer.max_steps=3",
        "optimized_metric=null",
        cwd=tmp_path,
    )  # fmt: skip
    output, _ = interrupted.communicate(timeout=300)
    assert interrupted.returncode == 128 + signal.SIGINT, output[-3000:]
    assert "Resume with: python train.py ckpt_path=" in output
    straight_output, _ = straight.communicate(timeout=300)
    assert straight.returncode == 0, straight_output[-3000:]
    saved, expected = (
        torch.load(tmp_path / run / "checkpoints" / "last.ckpt", weights_only=True)
        for run in ("interrupted", "straight")
    )
    assert saved["global_step"] == expected["global_step"] == 3
    for key, tensor in expected["state_dict"].items():
        torch.testing.assert_close(saved["state_dict"][key], tensor, rtol=0, atol=0, msg=key)


def test_first_ctrl_c_waits_for_the_step_end_and_a_second_stops_at_once() -> None:
    """The first Ctrl-C becomes Lightning's SIGTERM request; the second raises at once."""
    sigterms: list[int] = []
    before = signal.signal(signal.SIGTERM, lambda signum, frame: sigterms.append(signum))
    before_ctrl_c = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        callback = CheckpointOnInterrupt()
        callback.on_train_start(None, None)
        os.kill(os.getpid(), signal.SIGINT)
        assert sigterms == [signal.SIGTERM] and callback.stopped_by == signal.SIGINT
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, before)
        signal.signal(signal.SIGINT, before_ctrl_c)
