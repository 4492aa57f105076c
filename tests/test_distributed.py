"""Several processes under Hydra on a CPU machine (gloo): folders, ranks and reduced metrics."""

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from kindling.config import checks
from kindling.config.instantiate import build
from kindling.run import hydra_ddp
from kindling.train import run

from conftest import PYTHON, QUIET, ROOT

TWO_CPUS = ["trainer.accelerator=cpu", "trainer.devices=2"]


def launch(*command: str, cwd: Path) -> str:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def train_py(*args: str, cwd: Path) -> str:
    return launch(*PYTHON, str(ROOT / "train.py"), *args, cwd=cwd)


def only_child(folder: Path) -> Path:
    (child,) = [p for p in folder.iterdir() if not p.name.startswith(".")]
    return child


@pytest.mark.slow
def test_multirun_with_two_processes_per_job(tmp_path: Path) -> None:
    """Each job runs once with both ranks, in its own folder under one sweep folder."""
    output = train_py("-m", "model=cnn,lstm", *TWO_CPUS, "debug=limit", *QUIET, cwd=tmp_path)
    sweep_dir = only_child(tmp_path / "logs" / "debug" / "multiruns")
    jobs = sorted(p.name for p in sweep_dir.iterdir() if p.is_dir())
    assert jobs == ["0", "1"]
    for job in jobs:
        assert (sweep_dir / job / "checkpoints" / "last.ckpt").is_file()
        assert (sweep_dir / job / "csv" / "metrics.csv").is_file()
    # Both jobs started a 2-process group; no rank started a sweep or a run folder of its own.
    assert output.count("Starting with 2 processes") == 2
    assert output.count("Launching 2 jobs locally") == 1
    assert not (tmp_path / "logs" / "debug" / "runs").exists()


@pytest.mark.slow
def test_torchrun_uses_one_run_folder(tmp_path: Path) -> None:
    output = launch(
        *PYTHON, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(ROOT / "train.py"), *TWO_CPUS, "debug=limit", *QUIET,
        cwd=tmp_path,
    )  # fmt: skip
    run_dir = only_child(tmp_path / "logs" / "debug" / "runs")
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert "Starting with 2 processes" in output


@pytest.mark.slow
def test_two_processes_test_every_sample_once_and_report_what_one_does(
    compose_config, tmp_path: Path
) -> None:
    """The 359 test images split unevenly over 2 processes of 32: none is left out or repeated."""
    run(compose_config("trainer=cpu", "debug=limit", "trainer.max_epochs=1", *QUIET))
    checkpoint = tmp_path / "run" / "checkpoints" / "last.ckpt"
    results = {}
    for devices, on_device in [(1, False), (2, False), (2, True)]:
        folder = f"test{devices}{'_on_device' * on_device}"
        train_py(
            "train=false", f"ckpt_path={checkpoint}", "trainer.accelerator=cpu",
            f"trainer.devices={devices}", f"data.on_device={on_device}", *QUIET,
            f"hydra.run.dir={folder}",
            cwd=tmp_path,
        )  # fmt: skip
        metrics = (tmp_path / folder / "csv" / "metrics.csv").read_text().splitlines()
        header, values = metrics[0].split(","), metrics[-1].split(",")
        counts = np.loadtxt(tmp_path / folder / "confusion_matrix.csv", delimiter=",")
        results[folder] = float(values[header.index("test/acc")]), int(counts.sum())
    assert results["test1"][1] == 359
    assert results["test2"] == results["test1"]
    assert results["test2_on_device"] == results["test1"]


def test_job_environment_restores_what_the_launcher_set(monkeypatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("MASTER_PORT", "1234")
    with hydra_ddp.job_environment():
        monkeypatch.setenv("LOCAL_RANK", "0")
        monkeypatch.setenv("MASTER_PORT", "5678")
    assert "LOCAL_RANK" not in os.environ
    assert os.environ["MASTER_PORT"] == "1234"


@pytest.mark.parametrize(("job_num", "gpus", "expected"), [(0, 4, [0]), (5, 4, [1]), (3, 0, [0])])
def test_job_device_spreads_parallel_jobs_over_gpus(monkeypatch, job_num, gpus, expected) -> None:
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf

    monkeypatch.setattr("torch.cuda.device_count", lambda: gpus)
    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: True))
    monkeypatch.setattr(
        HydraConfig, "get", staticmethod(lambda: OmegaConf.create({"job": {"num": job_num}}))
    )
    assert hydra_ddp.job_device() == expected


@pytest.mark.slow
def test_parallel_sweep_with_joblib(tmp_path: Path) -> None:
    output = train_py(
        "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "model=cnn,rnn",
        "trainer=cpu", "debug=limit", *QUIET,
        cwd=tmp_path,
    )  # fmt: skip
    sweep_dir = only_child(tmp_path / "logs" / "debug" / "multiruns")
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == ["0", "1"]
    for job in ("0", "1"):
        assert (sweep_dir / job / "checkpoints" / "last.ckpt").is_file()
    assert "Joblib.Parallel(n_jobs=2" in output


def test_fsdp_config_wraps_each_transformer_block(compose_config) -> None:
    from hydra.utils import instantiate
    from lightning.pytorch.strategies import FSDPStrategy

    from kindling.models.blocks import TransformerBlock

    cfg = compose_config("trainer=fsdp", "model=transformer")
    strategy = instantiate(cfg.trainer.strategy, _convert_="all")
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.kwargs["auto_wrap_policy"]._module_classes == {TransformerBlock}
    assert cfg.trainer.accelerator == "gpu" and cfg.trainer.precision == "bf16-mixed"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fsdp_trains_on_the_gpus(tmp_path: Path) -> None:
    devices = min(2, torch.cuda.device_count())
    train_py("trainer=fsdp", f"trainer.devices={devices}", "model=transformer", "debug=limit",
             *QUIET, cwd=tmp_path)  # fmt: skip
    run_dir = only_child(tmp_path / "logs" / "debug" / "runs")
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.parametrize("gpus", [1, 2, 4])
@pytest.mark.parametrize("option", ["ddp", "fsdp"])
def test_ddp_and_fsdp_take_every_visible_gpu(monkeypatch, compose_config, option, gpus) -> None:
    """One process per visible GPU, as kindling's checks count them and as Lightning does."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: gpus)
    cfg = compose_config(f"trainer={option}", "data.batch_size=64", *QUIET)
    checks.check_accelerator(cfg.trainer)
    assert checks.requested_world_size(cfg.trainer) == gpus
    assert build(cfg.trainer, "trainer").num_devices == gpus
