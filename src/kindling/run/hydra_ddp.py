"""Make Lightning's DDP launcher and Hydra agree: one run folder per job, every job run once.
Lightning starts ranks 1..N-1 by running the entry script again with `sys.argv`: under a
multirun each would run the whole sweep, in folders of its own. Loaded by multi-device runs,
which hand `child_rank_command` to Lightning's launchers (a private part of Lightning)."""

import inspect
import sys
from collections.abc import Sequence

from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_original_cwd, to_absolute_path
from lightning.fabric.strategies.launchers import subprocess_script as fabric_launcher
from lightning.pytorch.strategies.launchers import subprocess_script as pytorch_launcher

from kindling.internals import code_names, require


def check_hydra_launchers() -> None:
    for module in (pytorch_launcher, fabric_launcher):
        target = f"{module.__name__}._hydra_subprocess_cmd(local_rank)"
        command = getattr(module, "_hydra_subprocess_cmd", None)
        arguments = [*inspect.signature(command).parameters] if callable(command) else None
        require(arguments == ["local_rank"], target)
        # Replacing the function works only while the launcher looks it up by name.
        starts = getattr(module._SubprocessScriptLauncher, "_call_children_scripts", None)
        caller = "_SubprocessScriptLauncher._call_children_scripts"
        require("_hydra_subprocess_cmd" in code_names(starts), f"{target}, called by {caller}")


def start_ranks_as_this_job() -> None:
    """Have Lightning's launchers (Trainer and Fabric) start extra ranks with
    `child_rank_command`."""
    check_hydra_launchers()
    for module in (pytorch_launcher, fabric_launcher):
        module._hydra_subprocess_cmd = child_rank_command


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
