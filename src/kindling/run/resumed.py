"""Where a resumed run continues: in its checkpoint's run folder, its record beside the first's."""

import shutil
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from kindling.config.errors import UserError
from kindling.run import run_folder


def resume_folder(root: Any) -> Path | None:
    """The checkpoint's run folder, where resumed training (`ckpt_path`, `train=true`) goes on
    unless `resume_in_new_folder=true`; None for a new folder (also for a URL's checkpoint)."""
    if not (root.get("ckpt_path") and root.get("train")) or root.get("resume_in_new_folder"):
        return None
    from kindling.run.starting_checkpoint import resolve_checkpoint

    runs_dir = Path(root.paths.log_dir) / root.task_name / "runs"
    try:
        overrides = OmegaConf.select(root, "hydra.overrides.task")
        checkpoint = resolve_checkpoint(root.ckpt_path, runs_dir, overrides)
    except UserError:
        return None  # kindling.train reports it, with the rest of the checks
    if isinstance(checkpoint, str) or not checkpoint.is_file():
        return None
    run = checkpoint.parent.parent  # <run>/checkpoints/<file>.ckpt
    return run if checkpoint.parent.name == "checkpoints" and (run / ".hydra").is_dir() else None


def run_dir(log_dir: str, task_name: str, *, _root_: Any) -> str:
    """Hydra's run folder (`${run_dir:...}`): the checkpoint's when resuming there, else new."""
    return str(resume_folder(_root_) or run_folder.run_folder(log_dir, task_name))


_records: dict[Path, str] = {}  # this process's `.hydra/resumed_<stamp>` in each folder it resumes


def hydra_subdir(stamp: str, *, _root_: Any) -> str:
    """Where Hydra writes the config: `.hydra`, or `.hydra/resumed_<stamp>` (this process's alone)
    when resuming in an existing folder, so the first run's config is never overwritten."""
    folder = resume_folder(_root_)
    return ".hydra" if folder is None else _records.setdefault(folder, f".hydra/resumed_{stamp}")


def record_dir(output_dir: str | Path) -> Path:
    """Where this run writes its record (config tree, provenance): the run folder, or its
    `.hydra/resumed_<stamp>/` when resumed in an existing folder."""
    subdir = HydraConfig.get().output_subdir if HydraConfig.initialized() else None
    if subdir and Path(subdir).name.startswith("resumed_"):
        return Path(output_dir) / subdir
    return Path(output_dir)


def forget_refused(output_dir: str | Path) -> None:
    """Remove a refused resume's `.hydra/resumed_<stamp>/`: the run folder is left as it was."""
    record = record_dir(output_dir)
    if record != Path(output_dir):
        shutil.rmtree(record, ignore_errors=True)
