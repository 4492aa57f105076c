"""A run's configuration as its Hydra overrides, stored in every checkpoint's provenance.

`python train.py ckpt_path=<file>` without a configuration of its own composes them again, so a
checkpoint alone resumes its run as configured; `ckpt_path=last` takes the newest run whose
overrides are the command's (`kindling.run.resumed`).
"""

from collections.abc import Sequence
from pathlib import Path

from kindling.checkpoints import read_checkpoint
from kindling.config.errors import UserError

# What this command does (train, test) and where it resumes from, how Hydra runs it, a search:
# not what the run trains. (Hydra keeps its own `hydra.` overrides out of the task's; a search's
# group sets the sweeper.) `train=false ckpt_path=<file>` tests with the run's own data.
NOT_STORED = ("ckpt_path", "resume_in_new_folder", "train", "test", "hydra", "hparams_search")
# How long to train: what a resume may change (a finished run goes on with a larger one).
LENGTH = ("trainer.max_epochs", "trainer.max_steps")


def key(override: str) -> str:
    """`+model.x=1` -> `model.x`; `data=mnist` -> `data`; `~callbacks.ema` -> `callbacks.ema`."""
    return override.partition("=")[0].lstrip("+~")


def _under(name: str, keys: Sequence[str]) -> bool:
    """`name` is one of `keys`, or a key or option inside one (`data.path` is under `data`)."""
    return any(name == k or name.startswith((f"{k}.", f"{k}/")) for k in keys)


def run_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides that say what a run trains: those of `NOT_STORED` left out."""
    return [o for o in overrides if not _under(key(o), NOT_STORED)]


def same_configuration(stored: Sequence[str], given: Sequence[str]) -> bool:
    """The same overrides, in any order, but for the training's length."""

    def configuration(overrides: Sequence[str]) -> list[str]:
        return sorted(o for o in run_overrides(overrides) if key(o) not in LENGTH)

    return configuration(stored) == configuration(given)


def of_checkpoint(path: str | Path) -> list[str] | None:
    """The overrides stored in the checkpoint's provenance; None when it holds none (saved by an
    older kindling, or outside `train.py`) or cannot be read (the run's checks say why)."""
    try:
        provenance = read_checkpoint(path).get("provenance") or {}
    except UserError:
        return None
    overrides = provenance.get("overrides")
    return list(overrides) if isinstance(overrides, list) else None


def with_checkpoint_overrides(args: Sequence[str]) -> list[str]:
    """`train.py`'s arguments, with the stored overrides of the checkpoint `ckpt_path=<file>`
    names in front when the command gives no configuration of its own (only how long to train,
    train/test or Hydra's keys, which win over the stored ones): the run is composed as it was
    trained. A command with other overrides states the configuration itself, as it did before
    checkpoints stored theirs: a stored `+callbacks.x=...` it leaves out stays out."""
    given = [a for a in args if not a.startswith("-")]
    ckpt_path = next((a.partition("=")[2] for a in reversed(given) if key(a) == "ckpt_path"), "")
    own = [a for a in run_overrides(given) if key(a) not in LENGTH]
    if ckpt_path in ("", "last", "null") or own:
        return list(args)
    stored = of_checkpoint(ckpt_path)
    if not stored:
        return list(args)
    given_keys = {key(a) for a in given}
    return [*(o for o in stored if key(o) not in given_keys), *args]
