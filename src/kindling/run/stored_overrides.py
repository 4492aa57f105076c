"""A run's configuration as its Hydra overrides, stored in every checkpoint's provenance:
`python train.py ckpt_path=<file>` without a configuration of its own composes them again, and
`ckpt_path=last` takes the newest run whose overrides are the command's (`starting_checkpoint`)."""

from collections.abc import Sequence

# What the command does and where it resumes from, how Hydra runs it, a search: not what the run
# trains. `train=false ckpt_path=<file>` tests with the run's own data.
NOT_STORED = ("ckpt_path", "resume_in_new_folder", "train", "test", "hydra", "hparams_search")
LENGTH = ("trainer.max_epochs", "trainer.max_steps")  # a resume may change them


def key(override: str) -> str:
    """`+model.x=1` -> `model.x`; `data=mnist` -> `data`; `~callbacks.ema` -> `callbacks.ema`."""
    return override.partition("=")[0].lstrip("+~")


def run_overrides(overrides: Sequence[str]) -> list[str]:
    """The overrides that say what a run trains: none of `NOT_STORED` (or keys inside them)."""
    inside = tuple(f"{k}{sep}" for k in NOT_STORED for sep in "./")
    return [o for o in overrides if key(o) not in NOT_STORED and not key(o).startswith(inside)]


def with_checkpoint_overrides(args: Sequence[str]) -> list[str]:
    """`train.py`'s arguments, with the overrides stored in the checkpoint `ckpt_path=<file>` in
    front when the command configures nothing itself (but the length, train/test or Hydra's
    keys, which win)."""
    given = [a for a in args if not a.startswith("-")]
    ckpt_path = next((a.partition("=")[2] for a in reversed(given) if key(a) == "ckpt_path"), "")
    own = [a for a in run_overrides(given) if key(a) not in LENGTH]
    stored = None
    if ckpt_path not in ("", "last", "null") and not own:
        from kindling.run.starting_checkpoint import of_checkpoint

        stored = of_checkpoint(ckpt_path)
    given_keys = {key(a) for a in given}
    return [*(o for o in stored or () if key(o) not in given_keys), *args]
