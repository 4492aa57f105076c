"""On a SLURM scheduler (`slurm_cluster`: a throwaway one-node cluster, or your own): the tasks
SLURM starts, and the jobs `hydra/launcher=slurm` submits."""

from slurm_cluster import Cluster


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
