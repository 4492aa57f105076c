"""Checks of the config that fail fast, with a message that names the problem and the fix."""

from pathlib import Path

import torch
from omegaconf import DictConfig

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
