"""Several nodes: torchrun and SLURM launches that must agree with `trainer.num_nodes`, and the
run folder all the ranks of a launch share."""

import csv
import json
import os
import subprocess
import uuid
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, open_dict
from omegaconf.errors import InterpolationResolutionError

from kindling.errors import UserError
from kindling.run import run_folder
from kindling.run.launched import check_launched_processes
from kindling.train import run

from helpers import CONFIG_DIR, PYTHON, QUIET, ROOT, TESTS, free_port


def torchrun_env(monkeypatch, *, nodes: int, per_node: int, rank: int = 0) -> None:
    """What torchrun (`--rdzv-id=4242`) gives a worker of a launch of `nodes` x `per_node`."""
    for name in ("SLURM_NTASKS", "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID"):
        monkeypatch.delenv(name, raising=False)
    env = {
        "TORCHELASTIC_RUN_ID": "4242",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "GROUP_WORLD_SIZE": str(nodes),
        "LOCAL_WORLD_SIZE": str(per_node),
        "WORLD_SIZE": str(nodes * per_node),
        "RANK": str(rank),
        "GROUP_RANK": str(rank // per_node),
        "LOCAL_RANK": str(rank % per_node),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_num_nodes_that_torchrun_did_not_start_is_one_line(
    compose_config, tmp_path: Path, monkeypatch, caplog
) -> None:
    cfg = compose_config("trainer=cpu", *QUIET)
    torchrun_env(monkeypatch, nodes=2, per_node=1)
    with pytest.raises(SystemExit) as stop:
        run(cfg)
    assert stop.value.code == 1
    (message,) = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert message == (
        "trainer.num_nodes=1 and trainer.devices=1 ask for 1 x 1 processes, but torchrun started "
        "2 x 1 (nodes x processes per node). Set trainer.num_nodes=2 trainer.devices=1."
    )
    assert not (tmp_path / "run" / "checkpoints").exists()  # stopped before any work
    # What torchrun started, asked for: no error.
    with open_dict(cfg):
        cfg.trainer.num_nodes = 2
    check_launched_processes(cfg.trainer)


def test_num_nodes_that_srun_did_not_start_is_one_line(compose_config, monkeypatch) -> None:
    cfg = compose_config("trainer=ddp_cpu", "trainer.num_nodes=2")
    for name, value in {
        "SLURM_NTASKS": "8",
        "SLURM_NNODES": "4",
        "SLURM_JOB_NAME": "train",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    with pytest.raises(UserError, match=r"Set trainer.num_nodes=4 trainer.devices=2\.$"):
        check_launched_processes(cfg.trainer)
    monkeypatch.setenv("SLURM_NNODES", "2")
    with pytest.raises(UserError, match=r"srun started 2 x 4 .* trainer.devices=4\.$"):
        check_launched_processes(cfg.trainer)
    monkeypatch.setenv("SLURM_NTASKS", "4")
    check_launched_processes(cfg.trainer)


def test_the_slurm_launcher_asks_for_the_trainers_nodes_and_devices() -> None:
    """A multirun on SLURM (`-m hydra/launcher=slurm`) asks each job's allocation for
    `trainer.num_nodes` nodes of `trainer.devices` tasks and GPUs."""
    GlobalHydra.instance().clear()
    overrides = ["hydra/launcher=slurm", "trainer=ddp", "trainer.num_nodes=3", "trainer.devices=4"]
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=True)
    GlobalHydra.instance().clear()
    launcher = cfg.hydra.launcher
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (3, 4, 4)


def slurm_launcher(*overrides: str) -> DictConfig:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(
            "train", overrides=["hydra/launcher=slurm", *overrides], return_hydra_config=True
        )
    GlobalHydra.instance().clear()
    return cfg.hydra.launcher


def test_the_slurm_launcher_asks_for_gpus_only_to_train_on_gpus() -> None:
    """A CPU partition has no GPUs to give: sbatch refuses a job that asks for one."""
    on_cpus = slurm_launcher("trainer.accelerator=cpu", "trainer.devices=2")
    assert (on_cpus.tasks_per_node, on_cpus.gpus_per_node) == (2, None)
    assert slurm_launcher("trainer.devices=2").gpus_per_node == 2  # auto: the GPUs a job has


def test_the_slurm_launcher_needs_a_number_of_gpus() -> None:
    """trainer=ddp takes every GPU of the machine it runs on (`devices: auto`); SLURM must be told
    how many to allocate before there is one."""
    listed = slurm_launcher("trainer=ddp", "trainer.devices=[0,1]")
    assert (listed.tasks_per_node, listed.gpus_per_node) == (2, 2)
    launcher = slurm_launcher("trainer=ddp")
    with pytest.raises(
        InterpolationResolutionError, match=r"set it, e\.g\. trainer\.devices=4\.\n"
    ):
        launcher.gpus_per_node  # noqa: B018 - resolving it is the test


def test_the_ranks_of_two_nodes_name_one_run_and_sweep_folder(tmp_path: Path, monkeypatch) -> None:
    """Each rank names the folders from the run id all nodes share; none writes for the others."""

    def named_by(rank: int) -> tuple[Path, str]:
        run_folder._new_folder.cache_clear()  # each rank is a process of its own
        torchrun_env(monkeypatch, nodes=2, per_node=1, rank=rank)
        return run_folder.run_folder(str(tmp_path), "train"), run_folder.sweep_folder(
            str(tmp_path), "train"
        )

    runs, sweep = named_by(1)  # node 1's rank may start first: it waits for no one
    assert named_by(0) == (runs, sweep)
    assert runs == tmp_path / "train" / "runs" / "torchrun-4242"
    assert sweep == str(tmp_path / "train" / "multiruns" / "torchrun-4242")
    assert not any(tmp_path.iterdir())
    run_folder._new_folder.cache_clear()


@pytest.mark.slow
def test_two_nodes_of_torchrun_share_one_run_folder_and_split_the_data(tmp_path: Path) -> None:
    """Two torchrun launches on this machine, `--nnodes=2`, one CPU process each (gloo).

    The data is split by global rank, whatever the nodes: Lightning's DistributedSampler for
    training (image folders too), kindling's for evaluation; so the digits stand for every
    data set here (an image folder's two-process run is in test_image_folder.py)."""
    port, launch = free_port(), str(uuid.uuid4())  # the id every node of this launch shares
    path = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path}
    torchrun = [*PYTHON, "-m", "torch.distributed.run"]
    command = [
        "--nnodes=2", "--nproc_per_node=1", f"--rdzv-id={launch}",
        "--master_addr=127.0.0.1", f"--master_port={port}", str(ROOT / "train.py"),
        "trainer.accelerator=cpu", "trainer.devices=1", "trainer.num_nodes=2",
        "trainer.max_epochs=1", "trainer.limit_train_batches=4", "trainer.limit_val_batches=2",
        "trainer.limit_test_batches=2", "data.batch_size=32",
        "+callbacks.record._target_=record_samples.RecordSamples", *QUIET,
    ]  # fmt: skip
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True}
    nodes = [
        subprocess.Popen(
            [*torchrun, f"--node_rank={rank}", *command], cwd=tmp_path, env=env, **pipes
        )
        for rank in (0, 1)
    ]
    outputs = [node.communicate(timeout=600)[0] for node in nodes]
    for node, output in zip(nodes, outputs, strict=True):
        assert node.returncode == 0, output[-4000:]

    (run_dir,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    assert run_dir.name == f"torchrun-{launch}"
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "epoch_000.ckpt", "last.ckpt"
    ]  # fmt: skip
    with open(run_dir / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    for metric in ("train/loss", "val/loss", "test/acc"):  # one row each: logged once
        assert len([r for r in rows if r[metric]]) == 1, metric
    # Each node trained on its own half of every batch: 4 steps x 16 images, none shared.
    seen = [set(json.loads((run_dir / f"samples_rank{r}.json").read_text())) for r in (0, 1)]
    assert len(seen[0]) == len(seen[1]) == 64
    assert not seen[0] & seen[1]
    assert [p.name for p in (tmp_path / "logs").iterdir()] == ["train"]  # nothing else written
