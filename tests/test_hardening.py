"""No rank hangs, interrupts stop at a step boundary, third-party internals are checked."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

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
