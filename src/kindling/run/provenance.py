"""What produced a run (command line, Hydra overrides, git commit, library versions): in the run
folder (`provenance.yaml`, and `git.diff` when the tree was dirty), in every checkpoint, and to
the loggers. The overrides say what the run trains: `python train.py ckpt_path=<file>` without a
configuration of its own composes them again, and `ckpt_path=last` takes the newest run whose
overrides are the command's (`starting_checkpoint`)."""

import platform
import shlex
import socket
import subprocess
import sys
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from lightning_utilities.core.rank_zero import rank_zero_only  # Lightning's, without torch

import kindling
from kindling.files import write_yaml

PROVENANCE_FILE = "provenance.yaml"
DIFF_FILE = "git.diff"
NO_GIT = "no git"
# What the command does and where it resumes from, how Hydra runs it, a search: not what the run
# trains. `train=false ckpt_path=<file>` tests with the run's own data.
NOT_STORED = ("ckpt_path", "resume_in_new_folder", "train", "test", "hydra", "hparams_search")
LENGTH = ("trainer.max_epochs", "trainer.max_steps")  # a resume may change them


def collect(code_dir: str | Path | None = None) -> dict[str, Any]:
    """The run's provenance; `code_dir`: the code's folder (kindling's own)."""
    # Here, in the run: a multirun's report imports this module without torch (`key`).
    import lightning
    import torch

    overrides = HydraConfig.get().overrides.task if HydraConfig.initialized() else None
    return {
        "command": shlex.join([sys.executable, *sys.argv]),
        # What `ckpt_path=<this run's checkpoint>` composes again (starting_checkpoint).
        "overrides": None if overrides is None else run_overrides(overrides),
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
    """The checkout holding `code_dir`: `commit`, `dirty`, `diff` (None when clean), `untracked`;
    commit `no git` outside one, or in site-packages (not the checkout a venv may sit in)."""
    outside = {"commit": NO_GIT, "dirty": None, "diff": None, "untracked": []}
    if {"site-packages", "dist-packages"} & set(code_dir.parts):
        return outside
    # Paths from the top of the checkout; the commit from the branch header ("(initial)": none).
    status = _git(code_dir, "-c", "status.relativePaths=false", "status", "--porcelain=v2",
                  "--branch", "--untracked-files=all")  # fmt: skip
    lines = (status or "").splitlines()
    commit = next((line.split()[2] for line in lines if line.startswith("# branch.oid ")), None)
    if commit in (None, "(initial)"):
        return outside
    untracked = [line[2:] for line in lines if line.startswith("? ")]
    changed = any(not line.startswith(("#", "?")) for line in lines)
    diff = _git(code_dir, "diff", "HEAD") if changed else None
    dirty = changed or bool(untracked)
    return {"commit": commit, "dirty": dirty, "diff": diff, "untracked": untracked}


def _git(folder: Path, *args: str) -> str | None:
    try:
        command = ["git", "-C", str(folder), *args]
        result = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):  # no git installed, or it hung
        return None
    return result.stdout if result.returncode == 0 else None


def summary(record: dict[str, Any]) -> dict[str, Any]:
    """The record without the diff's text: what provenance.yaml and the loggers hold."""
    diff = DIFF_FILE if record["git"]["diff"] is not None else None
    return {**record, "git": {**record["git"], "diff": diff}}


@rank_zero_only
def save(record: dict[str, Any], folder: str | Path) -> None:
    """Write `provenance.yaml` (and `git.diff` when the tree was dirty) into `folder`."""
    write_yaml(Path(folder) / PROVENANCE_FILE, summary(record))  # and makes the folder
    if record["git"]["diff"] is not None:
        (Path(folder) / DIFF_FILE).write_text(record["git"]["diff"])


def key(override: str) -> str:
    """`+model.x=1` -> `model.x`; `data=mnist` -> `data`; `~callbacks.ema` -> `callbacks.ema`."""
    return override.partition("=")[0].lstrip("+~")


def run_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides that say what a run trains: none of `NOT_STORED` (or keys inside them)."""
    inside = tuple(f"{k}{sep}" for k in NOT_STORED for sep in "./")
    return [o for o in overrides if key(o) not in NOT_STORED and not key(o).startswith(inside)]
