"""Checks of the config that fail fast, with a message that names the problem and the fix."""

import os
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from omegaconf import DictConfig

from kindling.checkpoints import is_url, read_checkpoint, without_compile_prefix
from kindling.config.errors import UserError
from kindling.run import stored_overrides


def requested_world_size(trainer: DictConfig) -> int:
    """How many processes the trainer config asks for (devices x nodes): `devices: auto` on GPUs
    counts the visible ones; a strategy that names its devices (trainer=ddp_one_gpu) runs one
    process for each."""
    strategy = trainer.get("strategy")
    if isinstance(strategy, DictConfig) and strategy.get("parallel_devices"):
        return len(strategy.parallel_devices) * int(trainer.get("num_nodes", 1))
    devices = trainer.get("devices", 1)
    if isinstance(devices, str) and devices.lstrip("-").isdigit():
        devices = int(devices)
    if devices in ("auto", -1):
        on_gpu = str(trainer.get("accelerator")) in ("gpu", "cuda", "auto")
        devices = max(1, torch.cuda.device_count()) if on_gpu else 1
    count = len(devices) if isinstance(devices, list | tuple) else devices
    if not isinstance(count, int) or count < 1:
        raise UserError(
            f"trainer.devices={devices!r} is not a device count: use a number (2), a list of "
            "GPU indices ([0, 2]) or auto."
        )
    return count * int(trainer.get("num_nodes", 1))


def check_accelerator(trainer: DictConfig) -> None:
    """A GPU config on a machine without one, or more GPUs than the machine has."""
    accelerator = str(trainer.get("accelerator", "auto")).lower()
    if accelerator in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise UserError(
                f"trainer.accelerator={accelerator} but CUDA is not available on this machine "
                "(torch.cuda.is_available() is False). Use trainer=cpu, or "
                "trainer.accelerator=auto to use a GPU only where there is one. "
                "`python -m kindling.device_report` shows what torch sees."
            )
        devices = trainer.get("devices", 1)
        wanted = len(devices) if isinstance(devices, list | tuple) else devices
        available = torch.cuda.device_count()
        if isinstance(wanted, int) and wanted > available:
            raise UserError(
                f"trainer.devices={devices} asks for {wanted} GPUs; this machine has {available}. "
                f"Use trainer.devices={available} (or fewer)."
            )
    if accelerator == "cpu":
        devices = trainer.get("devices", 1)
        cores = os.cpu_count() or 1
        if isinstance(devices, int) and devices > cores:
            raise UserError(
                f"trainer.devices={devices} asks for {devices} CPU processes; this machine has "
                f"{cores} cores. Use trainer.devices={min(2, cores)}."
            )
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise UserError("trainer.accelerator=mps but MPS is not available. Use trainer=cpu.")


def launched_processes() -> tuple[str, int, int] | None:
    """(launcher, nodes, processes per node) that torchrun or srun started; None for neither.

    Lightning joins the processes these launchers start rather than starting its own (and looks
    for SLURM first, as here).
    """
    env = os.environ
    if SLURMEnvironment.detect():
        nodes = int(env.get("SLURM_NNODES", "1"))
        return "srun", nodes, int(env["SLURM_NTASKS"]) // nodes
    if TorchElasticEnvironment.detect():
        nodes = int(env.get("GROUP_WORLD_SIZE", "1"))
        return "torchrun", nodes, int(env["LOCAL_WORLD_SIZE"])
    return None


def check_launched_processes(trainer: DictConfig) -> None:
    """`trainer.num_nodes` and `trainer.devices` say how many processes torchrun or srun started.

    Otherwise the ranks wait for processes that never come, or Lightning stops once the data and
    model are built, with a message about its own arguments.
    """
    launched = launched_processes()
    if launched is None:
        return
    launcher, nodes, per_node = launched
    num_nodes = int(trainer.get("num_nodes", 1))
    devices = requested_world_size(trainer) // num_nodes
    if (num_nodes, devices) != (nodes, per_node):
        raise UserError(
            f"trainer.num_nodes={num_nodes} and trainer.devices={trainer.get('devices')} ask for "
            f"{num_nodes} x {devices} processes, but {launcher} started {nodes} x {per_node} "
            f"(nodes x processes per node). Set trainer.num_nodes={nodes} "
            f"trainer.devices={per_node}."
        )


def check_model_fits_data(cfg: DictConfig) -> None:
    """A classifier needs classes: `experiment=charlm model=lstm` names the image classifier's
    LSTM on a text corpus, which has no `num_classes` to give it."""
    if "num_classes" not in cfg.model or "num_classes" in cfg.data:
        return
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    model, data = choices.get("model", "<option>"), choices.get("data", "<option>")
    raise UserError(
        f"model={model} is a classifier, and data={data} has no classes. For a language model "
        "use model=lm/<family>: model=lm/rnn, model=lm/lstm or model=lm/transformer."
    )


def check_checkpoint(path: Path | str, model: DictConfig) -> dict[str, Any]:
    """The checkpoint exists, is one, and was written for the same kind of net; returns it."""
    checkpoint = read_checkpoint(path)
    stored = checkpoint.get("config", {}).get("model", {}).get("net", {}).get("_target_")
    wanted = model.get("net", {}).get("_target_")
    if stored and wanted and stored != wanted:
        raise UserError(
            f"{path} holds a {stored.rsplit('.', 1)[-1]}, but this run builds a "
            f"{wanted.rsplit('.', 1)[-1]}. Choose the matching model= option, or another ckpt_path."
        )
    return checkpoint


def check_weights_fit(path: Path | str, model: torch.nn.Module) -> None:
    """The checkpoint's weights have the shapes of the built model's: else Lightning stops in the
    middle of loading them, with a long traceback. Weights the model has not built yet (a
    language model's net, built from the data) are left to the model."""
    checkpoint = read_checkpoint(path)  # mapped from disk, not read: checked before at no cost
    built = model.state_dict()
    for name, weights in without_compile_prefix(checkpoint["state_dict"]).items():
        if name in built and tuple(weights.shape) != tuple(built[name].shape):
            break
    else:
        return
    stored = (checkpoint.get("provenance") or {}).get("overrides") or []
    given = HydraConfig.get().overrides.task if HydraConfig.initialized() else []
    trained_with = [
        o
        for o in stored
        if o not in given and stored_overrides.key(o) not in stored_overrides.LENGTH
    ]
    was = f" Its run had {' '.join(trained_with)}." if trained_with else ""
    raise UserError(
        f"{path} does not fit this config's model: model.{name}: checkpoint "
        f"{list(weights.shape)}, this config {list(built[name].shape)}.{was} Resume with the "
        "overrides it was trained with (ckpt_path=<file> alone restores them), or start a new run."
    )


def check_training_left(checkpoint: dict[str, Any], path: Path | str, trainer: DictConfig) -> None:
    """Resuming a checkpoint whose training has ended (at `trainer.max_epochs`, or max_steps)
    would fit nothing, then test again and record the test alone: refused, with how to go on."""
    epochs = checkpoint["loops"]["fit_loop"]["epoch_progress"]["current"]["processed"]
    max_epochs, max_steps = trainer.get("max_epochs"), trainer.get("max_steps", -1)
    if max_epochs is None and max_steps == -1:
        max_epochs = 1000  # Lightning's default
    if max_epochs not in (None, -1) and epochs >= max_epochs:
        done = f"its checkpoint has {epochs} epochs of trainer.max_epochs={max_epochs}"
        further = f"trainer.max_epochs={2 * max(epochs, 1)}"
    elif max_steps != -1 and checkpoint["global_step"] >= max_steps:
        done = (
            f"its checkpoint has {checkpoint['global_step']} steps of trainer.max_steps={max_steps}"
        )
        further = f"trainer.max_steps={2 * max_steps}"
    else:
        return
    best = best_checkpoint(checkpoint, path)
    test = f"train=false ckpt_path={best}" if best else "train=false ckpt_path=<checkpoint>"
    raise UserError(
        f"{path} has finished training: {done}. To train further, resume with a larger "
        f"{further}; to test it again (in a folder of its own), {test}."
    )


def best_checkpoint(checkpoint: dict[str, Any], path: Path | str) -> Path | None:
    """The best checkpoint of the run that saved `checkpoint` (at `path`), found in `path`'s
    folder (the run folder may have moved since), or None."""
    if is_url(path):
        return None
    for key, state in checkpoint.get("callbacks", {}).items():
        if key.startswith("ModelCheckpoint") and state.get("best_model_score") is not None:
            best = Path(path).parent / Path(state["best_model_path"]).name
            if best.is_file():
                return best
    return None


def check_seed(seed: object) -> None:
    """`seed` goes to `seed_everything`, not to a `_target_`: checked here."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise UserError(f"seed must be a whole number or null, got {seed}.")
