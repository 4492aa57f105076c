"""Several processes under Hydra on a CPU machine (gloo): folders, ranks and reduced metrics."""

import csv
import json
import math
import os
import subprocess
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from lightning.fabric.utilities.exceptions import MisconfigurationException

from kindling import train_checks as checks
from kindling.config import resolvers
from kindling.config.instantiate import build
from kindling.run import job_record
from kindling.train import run

from helpers import PYTHON, QUIET, ROOT, in_folder, last_value, read_metrics
from helpers import train_py as run_train_py

TWO_CPUS = ["trainer.accelerator=cpu", "trainer.devices=2"]
# What a run needs to show its processes start and end as one: one short epoch, a checkpoint.
SHORT = ["debug=limit", "trainer.max_epochs=1", "test=false"]
QUIET_SHORT = [*SHORT, "callbacks.plots=null", *QUIET]
# A multirun's jobs without the report of them (seconds of tables and a plot; test_report's).
NO_REPORT = "~hydra.callbacks.multirun_report"


def launch(*command: str, cwd: Path) -> str:
    result = subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=600)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def train_py(*args: str, cwd: Path, new_interpreter: bool = False) -> str:
    result = run_train_py(*args, cwd=cwd, new_interpreter=new_interpreter)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def only_child(folder: Path) -> Path:
    (child,) = [p for p in folder.iterdir() if not p.name.startswith(".")]
    return child


@pytest.mark.slow
def test_multirun_with_two_processes_per_job(tmp_path: Path) -> None:
    """Each job runs once with both ranks, in its own folder under one sweep folder."""
    output = train_py("-m", "model=cnn,lstm", *TWO_CPUS, *QUIET_SHORT, NO_REPORT, cwd=tmp_path)
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
        str(ROOT / "train.py"), *TWO_CPUS, *QUIET_SHORT,
        cwd=tmp_path,
    )  # fmt: skip
    run_dir = only_child(tmp_path / "logs" / "debug" / "runs")
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert "Starting with 2 processes" in output


@pytest.mark.slow
def test_two_processes_test_every_sample_once_and_report_what_one_does(
    trained_run, compose_config, tmp_path: Path
) -> None:
    """The 359 test images split unevenly over 2 processes of 32: none is left out or repeated.
    The ranks are forked from this process (strategy=ddp_fork), which has imported all they need:
    how the data is dealt over them is the point here, not how they start."""
    checkpoint = trained_run.last_checkpoint
    # On one process: the run tested the weights it ended with, last.ckpt's.
    tested_in = {"test1": trained_run.run_dir}
    for folder, on_device in [("test2", False), ("test2_on_device", True)]:
        cfg = compose_config(
            "train=false", f"ckpt_path={checkpoint}", *TWO_CPUS, "trainer.strategy=ddp_fork",
            f"data.on_device={on_device}", *QUIET,
        )  # fmt: skip
        run(in_folder(cfg, tmp_path / folder))
        tested_in[folder] = tmp_path / folder
    results = {}
    for folder, run_dir in tested_in.items():
        counts = np.loadtxt(run_dir / "confusion_matrix.csv", delimiter=",")
        results[folder] = last_value(read_metrics(run_dir), "test/acc"), int(counts.sum())
    assert results["test1"][1] == 359
    assert results["test2"] == results["test1"]
    assert results["test2_on_device"] == results["test1"]


def test_job_environment_restores_what_the_launcher_set(monkeypatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    monkeypatch.setenv("MASTER_PORT", "1234")
    with job_record.job_environment():
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
    assert resolvers.job_device() == expected


@pytest.mark.slow
def test_parallel_sweep_with_joblib(tmp_path: Path) -> None:
    output = train_py(
        "-m", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "model=cnn,rnn",
        "trainer=cpu", *QUIET_SHORT, NO_REPORT,
        cwd=tmp_path, new_interpreter=True,  # joblib's pool of workers
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


def test_a_list_of_gpu_indices_asks_for_one_process_each(monkeypatch, compose_config) -> None:
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 4)
    cfg = compose_config("trainer=ddp", "trainer.devices=[1,3]", *QUIET)
    checks.check_accelerator(cfg.trainer)
    assert checks.requested_world_size(cfg.trainer) == 2
    with pytest.raises(checks.UserError, match=r"asks for 5 GPUs; this machine has 4"):
        checks.check_accelerator(
            compose_config("trainer=ddp", "trainer.devices=[0,1,2,3,4]").trainer
        )


# What each rank trained with, written by a callback `train.py` imports from tmp_path.
RANK_RECORD = """
import json
from pathlib import Path

import torch
from lightning.pytorch import Callback


class RankRecord(Callback):
    def __init__(self, folder: str):
        self.folder = folder

    def on_train_start(self, trainer, pl_module):
        loader, modules = trainer.train_dataloader, list(pl_module.modules())
        record = {
            "rank": trainer.global_rank,
            "world_size": trainer.world_size,
            "device": str(pl_module.device),
            "backend": torch.distributed.get_backend(),
            "sync_batchnorm": any(isinstance(m, torch.nn.SyncBatchNorm) for m in modules),
            "samples": loader.sampler.num_samples,  # DistributedSampler or DeviceTensorLoader
            "dataset": len(loader.dataset),
        }
        Path(self.folder, f"rank{trainer.global_rank}.json").write_text(json.dumps(record))
"""


def ddp_one_gpu(tmp_path: Path, *overrides: str) -> tuple[Path, list[dict]]:
    """`python train.py trainer=ddp_one_gpu <overrides>`: its run folder and each rank's record."""
    (tmp_path / "rank_record.py").write_text(RANK_RECORD)
    records = tmp_path / "records"
    records.mkdir()
    result = run_train_py(
        "trainer=ddp_one_gpu", *overrides, *QUIET, "callbacks.plots=null",
        "+callbacks.rank_record._target_=rank_record.RankRecord",
        f"+callbacks.rank_record.folder={records}",
        cwd=tmp_path, module_dir=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    run_dir = only_child(only_child(tmp_path / "logs") / "runs")  # one run folder for both ranks
    ranks = [json.loads(path.read_text()) for path in sorted(records.glob("rank*.json"))]
    return run_dir, ranks


def test_ddp_one_gpu_runs_two_processes_on_gpu_0(monkeypatch, compose_config) -> None:
    """Two ranks on one device, which `devices` cannot say: Lightning refuses [0, 0]."""
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.device_count", lambda: 1)
    with pytest.raises(MisconfigurationException, match="must be unique"):
        L.Trainer(accelerator="gpu", devices=[0, 0])
    cfg = compose_config("trainer=ddp_one_gpu", *QUIET)
    checks.check_accelerator(cfg.trainer)
    assert checks.requested_world_size(cfg.trainer) == 2
    trainer = build(cfg.trainer, "trainer")
    assert trainer.world_size == 2 and trainer.strategy.launcher.num_processes == 2
    assert trainer.strategy.parallel_devices == [torch.device("cuda", 0)] * 2
    assert trainer.strategy.process_group_backend == "gloo"


@pytest.mark.slow
def test_ddp_one_gpu_on_two_cpu_processes(tmp_path: Path) -> None:
    """trainer=ddp_one_gpu's mechanism on this CPU: both ranks train, each on half the data, in
    one run folder. (SyncBatchNorm runs on GPUs only.)"""
    cpus = "[{_target_: torch.device, type: cpu}, {_target_: torch.device, type: cpu}]"
    run_dir, ranks = ddp_one_gpu(
        tmp_path, "trainer.accelerator=cpu", f"trainer.strategy.parallel_devices={cpus}",
        "trainer.sync_batchnorm=false", *SHORT,
    )  # fmt: skip
    assert [(r["rank"], r["world_size"], r["device"], r["backend"]) for r in ranks] == [
        (0, 2, "cpu", "gloo"),
        (1, 2, "cpu", "gloo"),
    ]
    assert all(r["samples"] in (r["dataset"] // 2, math.ceil(r["dataset"] / 2)) for r in ranks)
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ddp_one_gpu_trains_on_one_gpu(tmp_path: Path) -> None:
    """Two ranks share GPU 0 through gloo: synced batch norm (the default CNN has batch norm),
    half the data each, one run folder, and a model that learned."""
    run_dir, ranks = ddp_one_gpu(tmp_path, "trainer.max_epochs=3")
    assert [(r["rank"], r["world_size"], r["device"], r["backend"]) for r in ranks] == [
        (0, 2, "cuda:0", "gloo"),
        (1, 2, "cuda:0", "gloo"),
    ]
    assert all(r["sync_batchnorm"] for r in ranks)
    assert all(r["samples"] in (r["dataset"] // 2, math.ceil(r["dataset"] / 2)) for r in ranks)
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    with open(run_dir / "csv" / "metrics.csv") as f:
        (test_acc,) = [float(row["test/acc"]) for row in csv.DictReader(f) if row.get("test/acc")]
    assert test_acc > 0.5  # 10 classes: chance is 0.1


@pytest.mark.slow
def test_a_launch_that_fails_before_its_ranks_connect_ends_them_all(tmp_path: Path) -> None:
    """Rank 0 cannot open the ranks' meeting point (its port is taken) after starting rank 1:
    the command fails at once instead of leaving rank 1 retrying for 30 minutes."""
    import contextlib
    import signal
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        env = {**os.environ, "MASTER_PORT": str(taken.getsockname()[1])}
        command = [*PYTHON, str(ROOT / "train.py"), *TWO_CPUS, "debug=limit", *QUIET]
        launch = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip
        try:
            output, _ = launch.communicate(timeout=60)  # every rank's end closes the pipe
        finally:
            with contextlib.suppress(ProcessLookupError):  # ended already
                os.killpg(launch.pid, signal.SIGKILL)
    assert launch.returncode == 1, output[-3000:]
    assert "address already in use" in output.lower(), output[-3000:]
