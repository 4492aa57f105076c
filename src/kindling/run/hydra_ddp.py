"""Make Lightning's DDP launcher and Hydra agree: one run folder per job, every job run once.

Lightning's DDP launcher starts ranks 1..N-1 by running the entry script again. Under Hydra it
passes `sys.argv` on unchanged, so in a multirun (`-m`) each extra rank starts the whole sweep
again, in a run folder of its own. And the launcher leaves `LOCAL_RANK`, `WORLD_SIZE` and
`MASTER_PORT` in the environment, so the next job of a sweep believes its ranks are started from
outside and never starts them.

`child_rank_command` starts each extra rank as a single run of this job: the job's own overrides
(never the sweep), the job's own folder, no config of its own written. `job_environment`
restores the environment and tears down the process group after every job.
"""

import os
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch.distributed
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_original_cwd, to_absolute_path

# What Lightning's launcher writes into os.environ of the launching process.
_LAUNCHER_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NODE_RANK", "LOCAL_RANK", "WORLD_SIZE")


def child_rank_command(local_rank: int) -> tuple[Sequence[str], str]:
    """The command and working folder that start `local_rank` of the current Hydra job."""
    hydra_cfg = HydraConfig.get()
    import __main__

    if getattr(__main__, "__spec__", None) is None:
        command = [sys.executable, to_absolute_path(sys.argv[0])]
    else:
        command = [sys.executable, "-m", __main__.__spec__.name]
    # The overrides of this job alone: under -m, `model=cnn,lstm` became `model=cnn` for job 0.
    command += list(hydra_cfg.overrides.task)
    command += [
        # A single run, even where a config sets `hydra.mode: MULTIRUN` (hparams_search).
        "hydra.mode=RUN",
        # Quoted: the override grammar would read a comma in a path as a sweep.
        f'hydra.run.dir="{hydra_cfg.runtime.output_dir}"',
        # Rank 0 writes .hydra/ and train.log; the other ranks print to the console only.
        "hydra.output_subdir=null",
        "hydra/job_logging=stdout",
    ]
    # Config folders added with hydra.searchpath: the rank composes the same config as rank 0.
    command += [o for o in hydra_cfg.overrides.hydra if o.startswith("hydra.searchpath=")]
    return command, get_original_cwd()


def install() -> None:
    """Use `child_rank_command` in Lightning's launchers (Trainer and Fabric), checked first."""
    from kindling.internals import install_hydra_rank_command  # a private part of Lightning

    install_hydra_rank_command(child_rank_command)


@contextmanager
def job_environment() -> Iterator[None]:
    """Undo what a DDP job leaves behind, so the next job of a sweep starts clean."""
    saved = {name: os.environ.get(name) for name in _LAUNCHER_VARIABLES}
    try:
        yield
    finally:
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def job_device() -> list[int]:
    """The device of this job in a parallel sweep: `[job number mod device count]`.

    Outside a multirun, and on a machine without CUDA, device 0.
    """
    import torch

    job_num = 0
    if HydraConfig.initialized():
        job_num = HydraConfig.get().job.get("num", 0) or 0
    num_devices = torch.cuda.device_count()
    return [job_num % num_devices if num_devices else 0]
