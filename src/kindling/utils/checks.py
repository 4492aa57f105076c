"""Checks of the config that fail fast, with a message that names the problem and the fix."""

import os
from pathlib import Path

import torch
from hydra import compose
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from kindling.utils.checkpoint import read_checkpoint
from kindling.utils.errors import UserError


def requested_world_size(trainer: DictConfig) -> int:
    """How many processes the trainer config asks for (devices x nodes)."""
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


def check_checkpoint(path: Path, model: DictConfig) -> None:
    """The checkpoint exists, is one, and was written for the same kind of net."""
    checkpoint = read_checkpoint(path)
    stored = checkpoint.get("config", {}).get("model", {}).get("net", {}).get("_target_")
    wanted = model.get("net", {}).get("_target_")
    if stored and wanted and stored != wanted:
        raise UserError(
            f"{path} holds a {stored.rsplit('.', 1)[-1]}, but this run builds a "
            f"{wanted.rsplit('.', 1)[-1]}. Choose the matching model= option, or another ckpt_path."
        )


def is_number(value: object) -> bool:
    return isinstance(value, int | float)


def check_value_types(cfg: DictConfig) -> None:
    """A command-line value that is not a number where the config's own value is one.

    `trainer.max_epochs=abc` would otherwise fail deep inside Lightning. The config is composed
    again with the same group choices but without value overrides, to learn each key's type;
    only when some value given is not a number (a composition takes 0.3 s). A null where a
    number belongs is refused too: `trainer.max_epochs` also sets the cosine schedule's length.
    """
    if not (HydraConfig.initialized() and GlobalHydra.instance().is_initialized()):
        return
    hydra_cfg = HydraConfig.get()
    groups = set(hydra_cfg.runtime.choices)
    choices, values = [], {}
    for override in hydra_cfg.overrides.task:
        key, _, value = override.partition("=")
        if key.lstrip("+~") in groups:
            choices.append(override)
        # A number given is fine wherever it goes; only other values need the defaults' types.
        elif not key.startswith(("+", "~")) and not is_number(OmegaConf.select(cfg, key)):
            values[key] = value
    if not values:
        return
    # Config folders added with hydra.searchpath= must be searched again.
    searchpath = [o for o in hydra_cfg.overrides.hydra if o.startswith("hydra.searchpath")]
    try:
        defaults = compose(config_name=hydra_cfg.job.config_name, overrides=choices + searchpath)
    except Exception:  # a composition this check cannot repeat: the constructors still check
        return
    for key, given in values.items():
        default = OmegaConf.select(defaults, key, throw_on_resolution_failure=False)
        expects_number = is_number(default) and not isinstance(default, bool)
        if expects_number and not is_number(OmegaConf.select(cfg, key)):
            raise UserError(f"{key} must be a number (its default is {default}), got {given!r}.")
