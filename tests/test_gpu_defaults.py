"""The GPU defaults (precision, TF32, cudnn.benchmark): each branch checked on the CPU with a
pretend CUDA device, and the real thing on a GPU."""

import csv
from pathlib import Path

import lightning as L
import pynvml
import pytest
import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from omegaconf import OmegaConf, open_dict

from kindling.checkpoints import read_checkpoint
from kindling.data.digits import DigitsDataModule
from kindling.data.sequences import SequenceTableDataModule
from kindling.data.streaming import StreamingDataModule
from kindling.hardware import best_precision
from kindling.train import build_trainer, run

from helpers import QUIET


def pretend_cuda(monkeypatch, *capabilities: tuple[int, int]) -> None:
    """CUDA devices of these compute capabilities (none: no CUDA), as Lightning counts them and
    NVML describes them; any torch.cuda call that would initialise CUDA fails the test."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: bool(capabilities))
    monkeypatch.setattr("torch.cuda.device_count", lambda: len(capabilities))
    monkeypatch.setattr("torch.version.hip", None)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    for name in ("_lazy_init", "get_device_capability", "get_device_properties", "init"):
        monkeypatch.setattr(f"torch.cuda.{name}", initialises_cuda)
    monkeypatch.setattr(pynvml, "nvmlInit", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlShutdown", lambda: None)
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCount", lambda: len(capabilities))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByIndex", lambda index: capabilities[index])
    monkeypatch.setattr(pynvml, "nvmlDeviceGetCudaComputeCapability", lambda handle: handle)


def initialises_cuda(*args, **kwargs):
    raise AssertionError("CUDA was initialised in this process")


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
    pretend_cuda(monkeypatch, *([capability] if capability else []))
    assert best_precision(accelerator) == expected


def test_the_oldest_visible_gpu_decides(monkeypatch) -> None:
    pretend_cuda(monkeypatch, (9, 0), (7, 0))
    monkeypatch.setattr(pynvml, "nvmlDeviceGetHandleByUUID", {"GPU-9": (9, 0)}.__getitem__)
    assert best_precision("gpu") == "16-mixed"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert best_precision("gpu") == "bf16-mixed"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-9")
    assert best_precision("gpu") == "bf16-mixed"
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert best_precision("gpu") == "16-mixed"


def test_torch_answers_where_nvml_cannot(monkeypatch) -> None:
    pretend_cuda(monkeypatch, (7, 0))

    def no_nvml() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_nvml)
    monkeypatch.setattr("torch.cuda.get_device_capability", lambda device=None: (8, 7))  # Orin
    assert best_precision("gpu") == "bf16-mixed"


def test_rocm_gpus_train_in_bfloat16(monkeypatch) -> None:
    pretend_cuda(monkeypatch, (9, 0))
    monkeypatch.setattr(pynvml, "nvmlInit", initialises_cuda)  # no NVML: AMD's GPUs
    monkeypatch.setattr("torch.version.hip", "6.2")
    assert best_precision("gpu") == "bf16-mixed"


def test_composing_the_config_asks_nothing_of_cuda(monkeypatch, compose_config) -> None:
    """`python train.py --cfg job --resolve` and every run's config: a CUDA context made here
    would stop strategy=ddp_fork's children."""
    pretend_cuda(monkeypatch, (9, 0))
    monkeypatch.setattr(pynvml, "nvmlInit", initialises_cuda)
    for overrides in [(), ("trainer=gpu",), ("trainer=ddp",), ("trainer=ddp_one_gpu",)]:
        trainer = OmegaConf.to_container(compose_config(*overrides).trainer, resolve=True)
        assert trainer["precision"] is None and trainer["benchmark"] is None
    assert compose_config("trainer.precision=16-mixed").trainer.precision == "16-mixed"


def test_the_trainer_is_built_in_the_devices_precision_without_initialising_cuda(
    monkeypatch, compose_config
) -> None:
    pretend_cuda(monkeypatch, (9, 0))
    cfg = compose_config(*QUIET)
    trainer = build_trainer(cfg, {})
    assert trainer.precision == "bf16-mixed" and isinstance(trainer.accelerator, CUDAAccelerator)
    assert cfg.trainer.precision == "bf16-mixed"  # what the run's record says
    assert not torch.cuda.is_initialized()
    pretend_cuda(monkeypatch, (7, 5))
    assert build_trainer(compose_config("trainer=gpu", *QUIET), {}).precision == "16-mixed"
    assert build_trainer(compose_config("trainer=cpu", *QUIET), {}).precision == "32-true"
    chosen = compose_config("trainer=gpu", "trainer.precision=32-true", *QUIET)
    assert build_trainer(chosen, {}).precision == "32-true"


SEQUENCES = SequenceTableDataModule(path="table.csv", num_features=2, num_classes=3)
IMAGES = DigitsDataModule(data_dir="data", num_classes=10, image_shape=[1, 8, 8])


@pytest.mark.parametrize(
    ("datamodule", "overrides", "expected"),
    [
        (IMAGES, [], True),
        (StreamingDataModule(input_dir="copy", num_classes=3, image_shape=[1, 8, 8]), [], True),
        (SEQUENCES, [], False),  # padded to each batch's longest: a new shape every batch
        (StreamingDataModule(input_dir="copy", num_classes=3), [], False),  # of sequences
        (L.LightningDataModule(), [], False),  # a data module that does not say: torch's default
        (IMAGES, ["trainer.deterministic=true"], False),  # it would undo deterministic kernels
        (IMAGES, ["trainer.benchmark=false"], False),
        (SEQUENCES, ["trainer.benchmark=true"], True),
    ],
)
def test_cudnn_benchmark_is_on_where_the_batch_shapes_are_fixed(
    monkeypatch, compose_config, datamodule, overrides, expected
) -> None:
    # Lightning sets these process-wide: restored afterwards.
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", not expected)
    monkeypatch.setattr(torch, "use_deterministic_algorithms", lambda *args, **kwargs: None)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    cfg = compose_config("trainer=cpu", *QUIET, *overrides)
    build_trainer(cfg, {}, datamodule=datamodule)
    assert torch.backends.cudnn.benchmark is expected and cfg.trainer.benchmark is expected


def test_matmuls_use_tf32(compose_config) -> None:
    assert compose_config().float32_matmul_precision == "high"


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
