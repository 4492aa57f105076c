"""The checkpoint a run starts from (`ckpt_path=`): the overrides it brings, which file `last`
means, and whether it fits the run. Loaded only by a run given a checkpoint."""

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from kindling.checkpoints import read_checkpoint, without_compile_prefix
from kindling.errors import UserError
from kindling.files import is_url
from kindling.run import LAST_CHECKPOINT
from kindling.run.provenance import LENGTH, key, run_overrides


def of_checkpoint(path: str | Path) -> list[str] | None:
    """The overrides stored in the checkpoint; None when it holds none or cannot be read (the
    run's checks say why)."""
    try:
        overrides = (read_checkpoint(path).get("provenance") or {}).get("overrides")
    except UserError:
        return None
    return list(overrides) if isinstance(overrides, list) else None


def with_checkpoint_overrides(args: Sequence[str], config_dir: Path) -> list[str]:
    """`train.py`'s arguments, with the overrides stored in the checkpoint (`ckpt_path=<file>`,
    or `last`: the file it names) in front, where the command configures nothing itself or the
    same as the checkpoint (but the length, train/test or Hydra's keys, which win): a finished
    run stays finished however it is named."""
    given = [a for a in args if not a.startswith("-")]
    ckpt_path = next((a.partition("=")[2] for a in reversed(given) if key(a) == "ckpt_path"), "")
    if ckpt_path == "last":
        ckpt_path = str(last_of_command(given, config_dir) or "")
    stored = of_checkpoint(ckpt_path) if ckpt_path not in ("", "null") else None
    if stored is None or configuration(given) not in ([], configuration(stored)):
        return list(args)
    given_keys = {key(a) for a in given}
    return [*(o for o in stored if key(o) not in given_keys), *args]


def configuration(overrides: Sequence[str]) -> list[str]:
    """What the overrides configure, in any order: all but the run's length."""
    return sorted(o for o in run_overrides(overrides) if key(o) not in LENGTH)


def last_of_command(overrides: Sequence[str], config_dir: Path) -> Path | None:
    """The file `ckpt_path=last` names for `train.py <overrides>`; None where there is none
    (the run's checks say why)."""
    from hydra import compose, initialize_config_dir

    task = [o for o in overrides if not key(o).startswith("hydra.")]
    try:
        with initialize_config_dir(str(config_dir.resolve()), version_base="1.3"):
            root = compose("train", task)
        runs_dir = Path(root.paths.log_dir, root.task_name, "runs")
        checkpoint = resolve_checkpoint("last", runs_dir, task)
    except Exception:  # the run composes it again, and says what is wrong
        return None
    return checkpoint if isinstance(checkpoint, Path) else None


def resolve_checkpoint(
    ckpt_path: str | None, runs_dir: str | Path, overrides: Sequence[str] | None = None
) -> Path | str | None:
    """`ckpt_path` as a file; a URL (`s3://...`) stays a string. `last`: the newest
    `checkpoints/last.ckpt` under `runs_dir` of a run configured with `overrides` (any when None;
    a checkpoint that stores none counts)."""
    if ckpt_path != "last":
        return ckpt_path if ckpt_path is None or is_url(ckpt_path) else Path(ckpt_path)
    candidates = sorted(
        Path(runs_dir).glob(f"*/{LAST_CHECKPOINT}"), key=lambda p: p.stat().st_mtime
    )
    if not candidates:
        raise UserError(
            f"ckpt_path=last: no run under {runs_dir} has a {LAST_CHECKPOINT}. "
            "Give the checkpoint file with ckpt_path=<path>."
        )
    if overrides is None:
        return candidates[-1]
    others = []
    for last in reversed(candidates):
        stored = of_checkpoint(last)
        if stored is None or configuration(stored) == configuration(overrides):
            return last
        others.append(f"{last.parent.parent} ({' '.join(stored) or 'no overrides'})")
    shown = "; ".join(others[:3]) + ("; ..." if len(others) > 3 else "")
    given = " ".join(run_overrides(overrides)) or "none"
    raise UserError(
        f"ckpt_path=last: no run under {runs_dir} has this command's overrides ({given}). "
        f"Runs, newest first: {shown}. Resume one with ckpt_path=<run>/{LAST_CHECKPOINT} "
        "(its overrides come with it)."
    )


def resume_folder(root: Any) -> Path | None:
    """The run folder of the checkpoint resumed training starts from; None for a new folder (a
    URL's checkpoint, or one outside a run folder)."""
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


def checked_checkpoint(cfg: DictConfig) -> str:
    """The file `cfg.ckpt_path` names, checked: a checkpoint of the same kind of net, and, when
    training, with training left to do."""
    runs_dir = Path(cfg.paths.log_dir) / cfg.task_name / "runs"
    overrides = HydraConfig.get().overrides.task if HydraConfig.initialized() else None
    path = resolve_checkpoint(cfg.ckpt_path, runs_dir, overrides)
    checkpoint = read_checkpoint(path)
    stored = checkpoint.get("config", {}).get("model", {}).get("net", {}).get("_target_")
    wanted = cfg.model.get("net", {}).get("_target_")
    if stored and wanted and stored != wanted:
        raise UserError(
            f"{path} holds a {stored.rsplit('.', 1)[-1]}, but this run builds a "
            f"{wanted.rsplit('.', 1)[-1]}. Choose the matching model= option, or another ckpt_path."
        )
    if cfg.get("train"):
        check_training_left(checkpoint, path, cfg.trainer)
        if not cfg.get("resume_in_new_folder"):  # its folder's checkpoints are the run's own
            warnings.filterwarnings("ignore", r"Checkpoint directory .* exists and is not empty")
    return str(path)


def check_weights_fit(path: Path | str, model: torch.nn.Module) -> None:
    """The checkpoint's weights have the shapes of the built model's (else Lightning stops midway
    through loading them, with a long traceback). Weights the model has not built yet (a language
    model's net, built from the data) are left to the model."""
    checkpoint = read_checkpoint(path)  # mapped from disk, not read: checked before at no cost
    built = model.state_dict()
    for name, weights in without_compile_prefix(checkpoint["state_dict"]).items():
        if name in built and tuple(weights.shape) != tuple(built[name].shape):
            break
    else:
        return
    stored = (checkpoint.get("provenance") or {}).get("overrides") or []
    given = HydraConfig.get().overrides.task if HydraConfig.initialized() else []
    trained_with = [o for o in stored if o not in given and key(o) not in LENGTH]
    was = f" Its run had {' '.join(trained_with)}." if trained_with else ""
    raise UserError(
        f"{path} does not fit this config's model: model.{name}: checkpoint "
        f"{list(weights.shape)}, this config {list(built[name].shape)}.{was} Resume with the "
        "overrides it was trained with (ckpt_path=<file> alone restores them), or start a new run."
    )


def start_from_weights(path: str, model: torch.nn.Module) -> None:
    """`weights_from=<checkpoint>`: the built model takes the checkpoint's weights, every one of
    them, and nothing else of it (a new run: its own optimizer, schedule and epochs)."""
    check_weights_fit(path, model)
    weights = without_compile_prefix(read_checkpoint(path)["state_dict"])
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        names = ", ".join([*missing, *unexpected][:4])
        raise UserError(
            f"weights_from={path} does not fit this config's model: weights {names} are in only "
            "one of them. Give the overrides of the run that wrote it, or another checkpoint."
        )


def check_training_left(checkpoint: dict[str, Any], path: Path | str, trainer: DictConfig) -> None:
    """Resuming a checkpoint whose training has ended would fit nothing, then test again."""
    epochs = checkpoint["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"]
    steps = checkpoint["global_step"]
    max_epochs, max_steps = trainer.get("max_epochs"), trainer.get("max_steps", -1)
    if max_epochs is None and max_steps == -1:
        max_epochs = 1000  # Lightning's default
    if max_epochs not in (None, -1) and epochs >= max_epochs:
        done = f"its checkpoint has {epochs} epochs of trainer.max_epochs={max_epochs}"
        further = f"trainer.max_epochs={2 * max(epochs, 1)}"
    elif max_steps != -1 and steps >= max_steps:
        done = f"its checkpoint has {steps} steps of trainer.max_steps={max_steps}"
        further = f"trainer.max_steps={2 * max_steps}"
    else:
        return
    raise UserError(
        f"{path} has finished training: {done}. To train further, resume with a larger "
        f"{further}; to test it again (in a folder of its own), train=false ckpt_path={path}."
    )
