"""Where a resumed run continues: which checkpoint `ckpt_path=last` means, and which folder."""

import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import OmegaConf

from kindling.checkpoints import is_url
from kindling.config.errors import UserError
from kindling.run import run_folder, stored_overrides


def find_last_checkpoint(
    runs_dir: str | Path, overrides: Sequence[str] | None = None
) -> Path | None:
    """The newest `checkpoints/last.ckpt` of the runs under `runs_dir` that were configured with
    `overrides` (any run when None), or None. A checkpoint that stores no overrides (older, or
    unreadable: the checks name it) counts as one of them."""
    candidates = sorted(
        Path(runs_dir).glob("*/checkpoints/last.ckpt"), key=lambda p: p.stat().st_mtime
    )
    if overrides is None or not candidates:
        return candidates[-1] if candidates else None
    others = []
    for last in reversed(candidates):
        stored = stored_overrides.of_checkpoint(last)
        if stored is None or stored_overrides.same_configuration(stored, overrides):
            return last
        others.append(f"{last.parent.parent} ({' '.join(stored) or 'no overrides'})")
    shown = "; ".join(others[:3]) + ("; ..." if len(others) > 3 else "")
    given = " ".join(stored_overrides.run_overrides(overrides)) or "none"
    raise UserError(
        f"ckpt_path=last: no run under {runs_dir} has this command's overrides ({given}). "
        f"Runs, newest first: {shown}. Resume one with ckpt_path=<run>/checkpoints/last.ckpt "
        "(its overrides come with it)."
    )


def resolve_checkpoint(
    ckpt_path: str | None, runs_dir: str | Path, overrides: Sequence[str] | None = None
) -> Path | str | None:
    """`ckpt_path` as a file: `last` is the newest last.ckpt of this task's runs configured with
    `overrides` (this command's). A URL in object storage (`s3://...`) stays a string, which
    fsspec and Lightning read."""
    if ckpt_path is None:
        return None
    if ckpt_path == "last":
        last = find_last_checkpoint(runs_dir, overrides)
        if last is None:
            raise UserError(
                f"ckpt_path=last: no run under {runs_dir} has a checkpoints/last.ckpt. "
                "Give the checkpoint file with ckpt_path=<path>."
            )
        return last
    return ckpt_path if is_url(ckpt_path) else Path(ckpt_path)


def checkpoint_run_folder(checkpoint: Path) -> Path | None:
    """The run folder a checkpoint belongs to: `<run>/checkpoints/<file>.ckpt` -> `<run>`."""
    if checkpoint.parent.name == "checkpoints" and (checkpoint.parent.parent / ".hydra").is_dir():
        return checkpoint.parent.parent
    return None


def resume_folder(root: Any) -> Path | None:
    """The run folder that a resumed training run continues in, or None for a new folder.

    Resuming training (`ckpt_path` set, `train=true`) continues in the checkpoint's run folder,
    so logs and checkpoints stay together, unless `resume_in_new_folder=true`. A checkpoint in
    object storage has no local run folder: the run continues in a new one.
    """
    if not (root.get("ckpt_path") and root.get("train")) or root.get("resume_in_new_folder"):
        return None
    runs_dir = Path(root.paths.log_dir) / root.task_name / "runs"
    try:
        overrides = OmegaConf.select(root, "hydra.overrides.task")
        checkpoint = resolve_checkpoint(root.ckpt_path, runs_dir, overrides)
    except UserError:
        return None  # kindling.train reports it, with the rest of the checks
    if isinstance(checkpoint, str) or not checkpoint.is_file():
        return None
    return checkpoint_run_folder(checkpoint)


def run_dir(log_dir: str, task_name: str, *, _root_: Any) -> str:
    """Hydra's run folder: `hydra.run.dir: ${run_dir:${paths.log_dir},${task_name}}`.

    The checkpoint's folder when resuming there, else a new folder of this run's own.
    """
    folder = resume_folder(_root_)
    return str(folder or run_folder.run_folder(log_dir, task_name))


# The `.hydra/resumed_<stamp>` folder of this process in each run folder it resumes.
_records: dict[Path, str] = {}


def hydra_subdir(stamp: str, *, _root_: Any) -> str:
    """Where Hydra writes the run's config: `.hydra`, or `.hydra/resumed_<stamp>` when resuming in
    an existing run folder, so the first run's config is never overwritten. The stamp's random
    suffix makes it this process's alone, whenever another resume started."""
    folder = resume_folder(_root_)
    if folder is None:
        return ".hydra"
    return _records.setdefault(folder, f".hydra/resumed_{stamp}")


def record_dir(output_dir: str | Path) -> Path:
    """Where this run writes its own record (config tree, provenance): the run folder, or the
    `.hydra/resumed_<stamp>/` of a run resumed in an existing folder, beside its config."""
    if HydraConfig.initialized():
        subdir = HydraConfig.get().output_subdir
        if subdir and Path(subdir).name.startswith("resumed_"):
            return Path(output_dir) / subdir
    return Path(output_dir)


def forget_refused(output_dir: str | Path) -> None:
    """Remove what a resume refused before any work wrote into the run folder, its own
    `.hydra/resumed_<stamp>/`, so that the run is left as it was."""
    record = record_dir(output_dir)
    if record != Path(output_dir):
        shutil.rmtree(record, ignore_errors=True)
