"""On a SLURM scheduler (`slurm_cluster`: a throwaway one-node cluster, or your own): the tasks
SLURM starts, and the jobs `hydra/launcher=slurm` submits."""

import subprocess
from pathlib import Path

import pytest
import yaml

from kindling.report import MARKDOWN

from conftest import PYTHON, QUIET, ROOT, start_train_py
from slurm_cluster import Cluster

# The smallest runs that train, validate, test and checkpoint, on one CPU each.
SMALL = ["trainer.accelerator=cpu", "trainer.max_epochs=2", "debug=limit", *QUIET]


def submit(cluster: Cluster, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python train.py -m hydra/launcher=slurm <args>` from `cwd`, as on a login node."""
    return subprocess.run(
        [*PYTHON, str(ROOT / "train.py"), "-m", *cluster.launcher(*args)],
        cwd=cwd, env=cluster.env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def test_the_cluster_starts_two_tasks_of_one_step(slurm_cluster: Cluster) -> None:
    output = slurm_cluster.run(
        "srun",
        f"--partition={slurm_cluster.partition}",
        "--ntasks=2",
        "--cpus-per-task=1",
        "--mem=100M",
        "printenv",
        "SLURM_PROCID",
    )
    assert sorted(output.split()) == ["0", "1"]


@pytest.mark.slow
def test_a_submission_slurm_refuses_is_one_line(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """No node has a petabyte of memory: sbatch's refusal, without a traceback."""
    done = submit(slurm_cluster, *SMALL, "hydra.launcher.mem_gb=1000000", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (1, "")
    *submitting, line = done.stdout.strip().splitlines()
    assert "[HYDRA] SLURM refused the jobs: sbatch: error: " in line
    assert line.endswith("`sinfo` lists its partitions and resources.")
    assert all("[HYDRA] " in line for line in submitting)  # the sweep folder and its jobs


@pytest.mark.slow
def test_a_multirun_on_slurm_trains_each_job_in_its_folder(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    done = submit(slurm_cluster, "model=cnn,lstm", *SMALL, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (sweep_dir,) = (tmp_path / "logs" / "debug" / "multiruns").iterdir()
    for job in ("0", "1"):
        results = yaml.safe_load((sweep_dir / job / "results.yaml").read_text())
        assert results["test/acc"] > 0.1  # better than chance on 10 classes
        assert (sweep_dir / job / "checkpoints" / "last.ckpt").is_file()
    report = (sweep_dir / MARKDOWN).read_text()
    assert "| model=cnn | completed" in report and "| model=lstm | completed" in report


@pytest.mark.slow
def test_one_job_of_two_tasks_trains_as_two_processes_do(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """SLURM starts both tasks; Lightning's SLURM environment joins them (gloo) in one folder."""
    two = ["trainer.devices=2", *SMALL]
    (tmp_path / "local").mkdir()
    local = start_train_py(*two, cwd=tmp_path / "local")  # Lightning starts rank 1 itself
    done = submit(slurm_cluster, *two, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert local.wait(timeout=300) == 0, local.stdout.read()
    (sweep_dir,) = (tmp_path / "logs" / "debug" / "multiruns").iterdir()
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == [".submitit", "0"]
    logs = "".join(p.read_text() for p in (sweep_dir / ".submitit").glob("*/*_log.*"))
    assert "MEMBER: 2/2" in logs and "Starting with 2 processes" in logs
    (local_dir,) = (tmp_path / "local" / "logs" / "debug" / "runs").iterdir()
    on_slurm = yaml.safe_load((sweep_dir / "0" / "results.yaml").read_text())
    by_hand = yaml.safe_load((local_dir / "results.yaml").read_text())
    assert on_slurm["test/acc"] == pytest.approx(by_hand["test/acc"], abs=1e-6)
    assert on_slurm["val/loss"] == pytest.approx(by_hand["val/loss"], abs=1e-6)
