"""The GPU defaults (precision, TF32, cudnn.benchmark): each branch checked on the CPU with a
pretend CUDA device, and the real thing on a GPU."""

import csv
from pathlib import Path

import pytest
import torch
from omegaconf import open_dict

from kindling.checkpoints import read_checkpoint
from kindling.config.instantiate import build
from kindling.hardware import best_precision
from kindling.train import run

from conftest import QUIET


def pretend_cuda(monkeypatch, capability: tuple[int, int] | None) -> None:
    """A CUDA device of this compute capability (None: no CUDA), as torch.cuda reports it."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: capability is not None)
    monkeypatch.setattr("torch.cuda.get_device_capability", lambda device=None: capability)
    monkeypatch.setattr("torch.version.hip", None)


@pytest.mark.parametrize(
    ("accelerator", "capability", "expected"),
    [
        ("auto", (9, 0), "bf16-mixed"),  # H100
        ("gpu", (8, 0), "bf16-mixed"),  # A100
        ("cuda", (7, 5), "16-mixed"),  # T4: tensor cores, no bfloat16
        ("auto", (7, 0), "16-mixed"),  # V100
        ("gpu", (6, 1), "32-true"),  # GTX 1080: no tensor cores
        ("auto", None, "32-true"),  # no GPU
        ("cpu", (9, 0), "32-true"),  # a GPU the run does not use
        ("mps", None, "32-true"),
    ],
)
def test_best_precision_for_each_device(monkeypatch, accelerator, capability, expected) -> None:
    pretend_cuda(monkeypatch, capability)
    assert best_precision(accelerator) == expected


def test_the_composed_config_picks_the_devices_precision(monkeypatch, compose_config) -> None:
    pretend_cuda(monkeypatch, (9, 0))
    assert compose_config().trainer.precision == "bf16-mixed"
    assert compose_config("trainer=ddp").trainer.precision == "bf16-mixed"
    assert compose_config("trainer=cpu").trainer.precision == "32-true"
    assert compose_config("trainer.precision=16-mixed").trainer.precision == "16-mixed"
    pretend_cuda(monkeypatch, (7, 5))
    assert compose_config("trainer=gpu").trainer.precision == "16-mixed"


def test_cudnn_benchmark_is_on_unless_deterministic(compose_config) -> None:
    cfg = compose_config()
    assert cfg.trainer.benchmark is True and cfg.float32_matmul_precision == "high"
    assert compose_config("trainer=gpu").trainer.benchmark is True
    assert compose_config("trainer.deterministic=true").trainer.benchmark is False
    assert compose_config("trainer.benchmark=false").trainer.benchmark is False


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU fallback")
def test_a_cpu_run_stays_in_float32(compose_config) -> None:
    trainer = build(compose_config().trainer, "trainer")
    assert trainer.precision == "32-true"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_default_config_trains_on_the_gpu_in_its_best_precision(
    compose_config, tmp_path: Path
) -> None:
    cfg = compose_config("debug=limit", "test=false", *QUIET)
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "gpu")
    value = run(cfg)
    checkpoint = read_checkpoint(tmp_path / "gpu" / "checkpoints" / "last.ckpt")
    precision = checkpoint["config"]["trainer"]["precision"]
    assert precision == best_precision("gpu") != "32-true"
    if torch.cuda.get_device_capability()[0] >= 8:
        assert precision == "bf16-mixed"
    assert checkpoint["global_step"] > 0 and value is not None
    assert torch.backends.cudnn.benchmark
    assert torch.get_float32_matmul_precision() == "high"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_16_mixed_learns_and_resumes_its_loss_scaler(compose_config, tmp_path: Path) -> None:
    common = ["trainer=gpu", "trainer.precision=16-mixed", "debug=limit", "test=false", *QUIET]
    run(compose_config(*common))  # 3 epochs of 5 steps
    checkpoint = tmp_path / "run" / "checkpoints" / "last.ckpt"
    saved = read_checkpoint(checkpoint)["MixedPrecision"]  # the GradScaler's state
    # Every step without an overflow counts towards growing the scale: steps went through it.
    assert 0 < saved["scale"] <= 2.0**16 and saved["_growth_tracker"] > 0
    run(compose_config(*common, "trainer.max_epochs=4", f"ckpt_path={checkpoint}"))
    resumed = read_checkpoint(checkpoint)["MixedPrecision"]
    # The scaler went on from its saved state: 5 more steps counted, or an overflow halved it.
    assert resumed["_growth_tracker"] == saved["_growth_tracker"] + 5 or (
        resumed["scale"] < saved["scale"]
    )
    with open(tmp_path / "run" / "csv" / "metrics.csv") as f:
        losses = [float(r["train/loss"]) for r in csv.DictReader(f) if r["train/loss"]]
    assert len(losses) == 4 and losses[-1] < losses[0]
