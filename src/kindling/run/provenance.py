"""What produced a run: its command line and Hydra overrides, the code's git commit, and the
library versions.

`collect()` is called once per run and costs one `git` subprocess (two when the tree is dirty).
The record goes into the run folder (`provenance.yaml`, and `git.diff` when the tree was dirty),
into every checkpoint (plain types: `torch.load(weights_only=True)` reads it), and to the
loggers with the hyperparameters (MLflow also gets it as run tags).
"""

import platform
import shlex
import socket
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import hydra
import lightning
import torch
import yaml
from hydra.core.hydra_config import HydraConfig
from lightning.pytorch.loggers import Logger, MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only

import kindling
from kindling.run.stored_overrides import run_overrides

PROVENANCE_FILE = "provenance.yaml"
DIFF_FILE = "git.diff"
NO_GIT = "no git"


def collect(code_dir: str | Path | None = None) -> dict[str, Any]:
    """The run's provenance as plain types. `code_dir`: the code's folder (kindling's own)."""
    return {
        "command": shlex.join([sys.executable, *sys.argv]),
        # What `ckpt_path=<this run's checkpoint>` composes again (kindling.run.stored_overrides).
        "overrides": (
            run_overrides(HydraConfig.get().overrides.task) if HydraConfig.initialized() else None
        ),
        "cwd": str(Path.cwd()),
        "host": socket.gethostname(),
        "started": datetime.now().isoformat(timespec="seconds"),
        "git": git_state(Path(code_dir or Path(kindling.__file__).parent)),
        "versions": {
            "python": platform.python_version(),
            "kindling": kindling.__version__,
            "torch": str(torch.__version__),  # a str subclass, which YAML and pickles refuse
            "cuda": torch.version.cuda,  # the CUDA torch was built with; None on CPU-only builds
            "lightning": lightning.__version__,
            "hydra": hydra.__version__,
        },
    }


def git_state(code_dir: Path) -> dict[str, Any]:
    """The git checkout holding `code_dir`: `commit`, `dirty`, `diff` (`git diff HEAD`, tracked
    files, None when there is none) and `untracked` files; commit `no git` outside a checkout.

    A copy installed into site-packages is not the checkout it may sit in (a .venv inside the
    repository), so it counts as outside.
    """
    outside = {"commit": NO_GIT, "dirty": None, "diff": None, "untracked": []}
    if {"site-packages", "dist-packages"} & set(code_dir.parts):
        return outside
    status = _git(
        code_dir,
        *("-c", "status.relativePaths=false"),  # paths from the top of the checkout
        *("status", "--porcelain=v2", "--branch", "--untracked-files=all"),
    )
    if status is None:
        return outside
    lines = status.splitlines()
    commit = next((line.split()[2] for line in lines if line.startswith("# branch.oid ")), None)
    if commit is None or commit == "(initial)":  # a repository without commits
        return outside
    untracked = [line[2:] for line in lines if line.startswith("? ")]
    changed = any(not line.startswith(("#", "?")) for line in lines)
    diff = _git(code_dir, "diff", "HEAD") if changed else None
    dirty = changed or bool(untracked)
    return {"commit": commit, "dirty": dirty, "diff": diff, "untracked": untracked}


def _git(folder: Path, *args: str) -> str | None:
    try:
        result = subprocess.run(
            ["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):  # no git installed, or it hung
        return None
    return result.stdout if result.returncode == 0 else None


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """The record without the diff's text: what provenance.yaml and the loggers hold."""
    git = dict(record["git"])
    git["diff"] = DIFF_FILE if git["diff"] is not None else None
    return {**record, "git": git}


@rank_zero_only
def save(record: dict[str, Any], folder: str | Path) -> None:
    """Write `provenance.yaml` (and `git.diff` when the tree was dirty) into `folder`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / PROVENANCE_FILE, "w") as f:
        yaml.safe_dump(summary(record), f, sort_keys=False, width=1000)
    if record["git"]["diff"] is not None:
        (folder / DIFF_FILE).write_text(record["git"]["diff"])


@rank_zero_only
def tag(record: dict[str, Any], loggers: list[Logger]) -> None:
    """Tag MLflow runs with the commit (MLflow's own `mlflow.source.git.commit`), the command
    and the versions; the other loggers take the record with the hyperparameters."""
    tags = {
        "command": record["command"],
        "git.dirty": str(record["git"]["dirty"]),
        **{f"version.{name}": str(value) for name, value in record["versions"].items()},
    }
    if record["git"]["commit"] != NO_GIT:
        tags["mlflow.source.git.commit"] = record["git"]["commit"]
    for logger in loggers:
        if isinstance(logger, MLFlowLogger):
            for key, value in tags.items():
                logger.experiment.set_tag(logger.run_id, key, value)
