"""A multirun continued in its own folder: `python train.py -m <its overrides>
hydra.sweep.dir=<its folder>` runs a killed or cut-off sweep's jobs again, each in its folder
(`<sweep>/<job number>`), from where the first attempt left it:

- a job that completed is kept as it is, and not run again;
- a job with a checkpoint resumes from its `last.ckpt`, exactly (`ResumeExactly`);
- a job that left no checkpoint (or never started) runs from the start.

A folder whose job had other overrides (another command) is refused, as any used run folder is.
Reads only YAML: Hydra's `${hydra_subdir:}` resolver asks before a job imports torch."""

from pathlib import Path
from typing import Any, Literal

import yaml

from kindling.run import LAST_CHECKPOINT

JOB_FILE = "job.yaml"  # kindling.run.job_record writes it

Earlier = Literal["completed", "resume", "restart"]


def earlier_job(folder: str | Path, overrides: list[str]) -> Earlier | None:
    """What the job with `overrides` finds in `folder`, its folder in a multirun: None where no
    job of these overrides ran there."""
    folder = Path(folder)
    recorded = read_record(folder / ".hydra" / "overrides.yaml")
    if recorded is None or list(recorded) != list(overrides):
        return None
    if (read_record(folder / JOB_FILE) or {}).get("status") == "completed":
        return "completed"
    return "resume" if (folder / LAST_CHECKPOINT).is_file() else "restart"


def read_record(path: Path) -> Any:
    """A record file's YAML; None where it is missing or damaged."""
    try:
        return yaml.safe_load(path.read_text()) if path.is_file() else None
    except (yaml.YAMLError, UnicodeDecodeError):  # damaged: not a job to continue
        return None
