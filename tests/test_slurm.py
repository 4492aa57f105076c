"""On a SLURM scheduler (`slurm_cluster`: a throwaway one-node cluster, or your own): the tasks
SLURM starts, and the jobs `hydra/launcher=slurm` submits."""

import subprocess
from pathlib import Path

import pytest
import yaml

from kindling.report import MARKDOWN

from conftest import PYTHON, QUIET, ROOT
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
