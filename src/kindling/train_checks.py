"""What `kindling.train` checks before anything is built, beyond each object's arguments: that
the model fits the data, the machine, a tracker's store (the launch: `kindling.run.launched`; the
checkpoint: `kindling.run.starting_checkpoint`). Each fails with one line and the fix."""

import inspect
import os

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_object
from omegaconf import DictConfig, ListConfig

from kindling.errors import UserError


def _choices() -> dict:
    """The options this run chose (`model=cnn`), where Hydra composed it."""
    return HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}


def check_model_fits_data(cfg: DictConfig) -> None:
    """A classifier needs classes: `experiment=charlm model=lstm` names the image classifier's
    LSTM on a text corpus, which has no `num_classes` to give it."""
    if "num_classes" not in cfg.model or "num_classes" in cfg.data:
        return
    model, data = _choices().get("model", "<option>"), _choices().get("data", "<option>")
    raise UserError(
        f"model={model} is a classifier, and data={data} has no classes. For a language model "
        "use model=lm/<family>: model=lm/rnn, model=lm/lstm or model=lm/transformer."
    )


def check_model_reads_data(cfg: DictConfig) -> None:
    """A net that takes `image_shape` and no `num_features` reads images only: refused for data
    without images (a sequence table) before it is built. Run once the data has filled in its
    keys (a streamed copy says whether it holds images)."""
    net = cfg.model.get("net")
    if not isinstance(net, DictConfig) or "_target_" not in net or cfg.data.get("image_shape"):
        return
    try:
        arguments = inspect.signature(get_object(net._target_)).parameters
    except ImportError:  # a target that names nothing: the argument check names it next
        return
    if "image_shape" not in arguments or "num_features" in arguments:
        return
    model, data = _choices().get("model", "<option>"), _choices().get("data", "<option>")
    raise UserError(
        f"model={model} reads images ({net._target_} takes image_shape, not num_features), and "
        f"data={data} has none. For sequences choose a model that reads them, e.g. model=lstm."
    )


def check_seed(seed: object) -> None:
    """`seed` goes to `seed_everything`, not to a `_target_`: checked here."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise UserError(f"seed must be a whole number or null, got {seed}.")


def _count(devices: object) -> object:
    """A list of device indices (a ListConfig from the config) asks for one device each."""
    return len(devices) if isinstance(devices, ListConfig | list) else devices


def requested_world_size(trainer: DictConfig) -> int:
    """How many processes the trainer config asks for (devices x nodes; `auto` on GPUs counts the
    visible ones; a strategy that names its devices runs one process for each)."""
    nodes = int(trainer.get("num_nodes", 1))
    strategy = trainer.get("strategy")
    if isinstance(strategy, DictConfig) and strategy.get("parallel_devices"):
        return len(strategy.parallel_devices) * nodes
    devices = trainer.get("devices", 1)
    if isinstance(devices, str) and devices.lstrip("-").isdigit():
        devices = int(devices)
    if devices in ("auto", -1):
        on_gpu = str(trainer.get("accelerator")) in ("gpu", "cuda", "auto")
        devices = max(1, torch.cuda.device_count()) if on_gpu else 1
    count = _count(devices)
    if not isinstance(count, int) or count < 1:
        raise UserError(
            f"trainer.devices={devices!r} is not a device count: use a number (2), a list of "
            "GPU indices ([0, 2]) or auto."
        )
    return count * nodes


def check_accelerator(trainer: DictConfig) -> None:
    """A GPU config on a machine without one, or more devices than it has: refused before the data
    is read, not once the data and model are built."""
    accelerator = str(trainer.get("accelerator", "auto")).lower()
    devices = trainer.get("devices", 1)
    if accelerator in ("gpu", "cuda"):
        if not torch.cuda.is_available():
            raise UserError(
                f"trainer.accelerator={accelerator} but CUDA is not available on this machine "
                "(torch.cuda.is_available() is False). Use trainer=cpu, or "
                "trainer.accelerator=auto to use a GPU only where there is one. "
                "`python -m kindling.device_report` shows what torch sees."
            )
        wanted = _count(devices)
        available = torch.cuda.device_count()
        if isinstance(wanted, int) and wanted > available:
            raise UserError(
                f"trainer.devices={devices} asks for {wanted} GPUs; this machine has {available}. "
                f"Use trainer.devices={available} (or fewer)."
            )
    cores = os.cpu_count() or 1
    if accelerator == "cpu" and isinstance(devices, int) and devices > cores:
        raise UserError(
            f"trainer.devices={devices} asks for {devices} CPU processes; this machine has "
            f"{cores} cores. Use trainer.devices={min(2, cores)}."
        )
    if accelerator == "mps" and not torch.backends.mps.is_available():
        raise UserError("trainer.accelerator=mps but MPS is not available. Use trainer=cpu.")


def check_tracking_uri(loggers: DictConfig | None) -> None:
    """MLflow with neither a tracking URI nor a folder falls back to a store MLflow 3 refuses."""
    for name, entry in (loggers or {}).items():
        if (
            entry is not None
            and str(entry.get("_target_", "")).endswith("MLFlowLogger")
            and entry.get("tracking_uri") is entry.get("save_dir") is None
            and not os.environ.get("MLFLOW_TRACKING_URI")
        ):
            raise UserError(
                f"logger.{name}.tracking_uri is null and MLFLOW_TRACKING_URI is not set: set one, "
                f"e.g. logger.{name}.tracking_uri=http://<host>:5000 (a server) or "
                f"sqlite:///logs/mlflow.db (a file)."
            )
