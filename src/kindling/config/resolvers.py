"""The resolvers the configs use (`${name:...}`), registered on import. Importing this module
loads neither torch nor Lightning: `train.py` composes a config for `--help`, `--cfg` and shell
completion with these alone, and imports the training code only to run."""

from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import ListConfig, OmegaConf

from kindling.errors import UserError
from kindling.run import run_folder


def pretrained_input(key: str, default: Any, *, _root_: Any) -> Any:
    """`size`, `mean` or `std` of a pretrained timm net's input (`model=timm` with
    `model.net.pretrained` or a `pretrained_file`), else `default`."""
    net = OmegaConf.select(_root_, "model.net", default=None)
    if net is None or net.get("_target_") != "kindling.models.timm_net.TimmClassifier":
        return default
    if not (net.get("pretrained") or net.get("pretrained_file")):
        return default
    from kindling.models.timm_net import pretrained_input

    value = pretrained_input(net.name, key)
    if key != "size" and OmegaConf.select(_root_, "data.channels", default=3) == 1:
        return [sum(value) / len(value)]  # grey images: timm sums the first conv's channels
    return value


def device_count(devices: Any) -> int:
    """trainer.devices as a number: SLURM allocates GPUs before `devices: auto` could count them."""
    if isinstance(devices, ListConfig):
        return len(devices)
    if isinstance(devices, int) and not isinstance(devices, bool) and devices > 0:
        return devices
    raise UserError(
        f"hydra/launcher=slurm asks SLURM for trainer.devices GPUs per node, and "
        f"trainer.devices={devices} is not a number of GPUs: set it, e.g. trainer.devices=4."
    )


def gpu_count(accelerator: Any, devices: Any) -> int | None:
    """The GPUs per node hydra/launcher=slurm asks for: trainer.devices on GPUs, None on CPUs."""
    return device_count(devices) if accelerator in ("gpu", "cuda", "auto") else None


def job_device() -> list[int]:
    """This job's device in a parallel sweep (`trainer=gpu_per_job`): job number mod devices."""
    import torch

    job_num = HydraConfig.get().job.get("num", 0) or 0 if HydraConfig.initialized() else 0
    return [job_num % max(torch.cuda.device_count(), 1)]


# Each run and multirun gets a folder of its own (configs/hydra/default.yaml), named once: cached,
# like Hydra's own `now`; resumed training continues in its checkpoint's run folder.
OmegaConf.register_new_resolver("run_stamp", run_folder.run_stamp, use_cache=True, replace=True)
OmegaConf.register_new_resolver("sweep_dir", run_folder.sweep_folder, use_cache=True, replace=True)
OmegaConf.register_new_resolver("run_dir", run_folder.run_dir, replace=True)
OmegaConf.register_new_resolver("hydra_subdir", run_folder.hydra_subdir, replace=True)
# The augment group pads crops by an eighth of the image size: `${div:${data.image_shape.1},8}`.
OmegaConf.register_new_resolver("div", lambda a, b: int(a) // int(b), replace=True)
# hydra/launcher=slurm asks for `${device_count:${trainer.devices}}` tasks per node and
# `${gpu_count:${trainer.accelerator},${trainer.devices}}` GPUs.
OmegaConf.register_new_resolver("device_count", device_count, replace=True)
OmegaConf.register_new_resolver("gpu_count", gpu_count, replace=True)
# trainer=gpu_per_job gives job N of a parallel sweep its own GPU: `devices: ${job_device:}`.
OmegaConf.register_new_resolver("job_device", job_device, replace=True)
# data=image_folder's size and statistics follow a pretrained timm net: `${pretrained_input:...}`.
OmegaConf.register_new_resolver("pretrained_input", pretrained_input, replace=True)
