"""A run whose processes torchrun or SLURM started (loaded there only: `run_folder.launched`):
the run folder's name, the same in every process of the launch; this process's rank and the
number of processes; and the check that the trainer asks for the processes the launcher started.
Naming imports no library: a job's script may name its folder without torch's seconds."""

import os
from typing import TYPE_CHECKING

from kindling.errors import UserError

if TYPE_CHECKING:
    from omegaconf import DictConfig


def check_launch() -> None:
    """Refuse, before Hydra composes, a launch whose ranks cannot name one run folder."""
    if slurm_name() is None:
        torchrun_name()


def slurm_name() -> str | None:
    """`slurm-<job id>[_<array task>][.<step>]` inside a SLURM job, else None."""
    job = os.environ.get("SLURM_ARRAY_JOB_ID") or os.environ.get("SLURM_JOB_ID")
    if job is None:
        return None
    task, step = os.environ.get("SLURM_ARRAY_TASK_ID"), os.environ.get("SLURM_STEP_ID")
    return f"slurm-{job}" + (f"_{task}" if task else "") + (f".{step}" if step else "")


def torchrun_name() -> str | None:
    """`torchrun-<run id>[-<restart>]` in a process torchrun started, else None."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if run_id is None:
        return None
    if run_id == "none":
        raise UserError(
            "torchrun started this run without an id of its own (--rdzv-id), so its processes "
            "cannot name one run folder. Give each launch its own: torchrun --standalone on one "
            "node, or --rdzv-id=<a new id, e.g. the job id> on every node."
        )
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"torchrun-{run_id}" + (f"-{restart}" if restart != "0" else "")


def launch() -> tuple[int, int]:
    """This process's rank and the number of processes of its launch (torchrun's or srun's)."""
    env = os.environ
    if "TORCHELASTIC_RUN_ID" in env:
        return int(env.get("RANK", "0")), int(env.get("WORLD_SIZE", "1"))
    if "SLURM_STEP_ID" in env:  # a task of `srun`; a batch script's own processes are lone
        return int(env.get("SLURM_PROCID", "0")), int(env.get("SLURM_STEP_NUM_TASKS", "1"))
    return 0, 1


def check_launched_processes(trainer: "DictConfig") -> None:
    """`trainer.num_nodes` x `trainer.devices` are the processes srun or torchrun started:
    otherwise the ranks wait for processes that never come."""
    from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment

    from kindling.train_checks import requested_world_size

    env = os.environ
    if SLURMEnvironment.detect():
        launcher, nodes = "srun", int(env.get("SLURM_NNODES", "1"))
        per_node = int(env["SLURM_NTASKS"]) // nodes
    elif TorchElasticEnvironment.detect():
        launcher, nodes = "torchrun", int(env.get("GROUP_WORLD_SIZE", "1"))
        per_node = int(env["LOCAL_WORLD_SIZE"])
    else:
        return
    num_nodes = int(trainer.get("num_nodes", 1))
    devices = requested_world_size(trainer) // num_nodes
    if (num_nodes, devices) != (nodes, per_node):
        raise UserError(
            f"trainer.num_nodes={num_nodes} and trainer.devices={trainer.get('devices')} ask for "
            f"{num_nodes} x {devices} processes, but {launcher} started {nodes} x {per_node} "
            f"(nodes x processes per node). Set trainer.num_nodes={nodes} "
            f"trainer.devices={per_node}."
        )
