"""Make Lightning's DDP launcher and Hydra agree: one run folder per job, every job run once.

Lightning starts ranks 1..N-1 by running the entry script again with `sys.argv`: under a
multirun each would run the whole sweep, in folders of its own. And it leaves `LOCAL_RANK`,
`WORLD_SIZE`, `MASTER_PORT` set, so the sweep's next job would think its ranks started outside.
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
    """The command and folder that start `local_rank` as a single run of this job, in its
    folder, writing no config of its own."""
    import __main__

    hydra_cfg = HydraConfig.get()
    spec = getattr(__main__, "__spec__", None)
    command = [sys.executable, *(["-m", spec.name] if spec else [to_absolute_path(sys.argv[0])])]
    return [
        *command,
        *hydra_cfg.overrides.task,  # this job's alone: `model=cnn,lstm` was `model=cnn` for job 0
        "hydra.mode=RUN",  # also where a config sets MULTIRUN (hparams_search)
        f'hydra.run.dir="{hydra_cfg.runtime.output_dir}"',  # quoted: a comma is not a sweep
        "hydra.output_subdir=null",  # rank 0 writes .hydra/ and train.log
        "hydra/job_logging=stdout",
        # Config folders added with hydra.searchpath: the same config as rank 0's.
        *(o for o in hydra_cfg.overrides.hydra if o.startswith("hydra.searchpath=")),
    ], get_original_cwd()


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
    """This job's device in a parallel sweep (`trainer=gpu_per_job`): job number mod devices."""
    job_num = HydraConfig.get().job.get("num", 0) or 0 if HydraConfig.initialized() else 0
    return [job_num % max(torch.cuda.device_count(), 1)]
