"""Checks of the config that fail fast, with a message that names the problem and the fix."""

import inspect
import os
import typing
from pathlib import Path
from types import NoneType, UnionType

import torch
from hydra.core.hydra_config import HydraConfig
from lightning.fabric.plugins.environments import SLURMEnvironment, TorchElasticEnvironment
from omegaconf import DictConfig, OmegaConf

from kindling.checkpoints import read_checkpoint
from kindling.config.errors import UserError
from kindling.config.instantiate import locate


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
    LSTM on a text corpus, whose config has no `num_classes` for it to read."""
    if "num_classes" in cfg.data.keys():  # noqa: SIM118 - keys only: nothing is resolved
        return
    if "data.num_classes" not in OmegaConf.to_yaml(cfg.model, resolve=False):
        return
    choices = HydraConfig.get().runtime.choices if HydraConfig.initialized() else {}
    model, data = choices.get("model", "<option>"), choices.get("data", "<option>")
    raise UserError(
        f"model={model} is a classifier, and data={data} has no classes. For a language model "
        "use model=lm/<family>: model=lm/rnn, model=lm/lstm or model=lm/transformer."
    )


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


# Top-level keys that kindling.train passes to a function rather than to a `_target_`.
TOP_LEVEL_TARGETS = {"seed": "lightning.seed_everything"}

# The annotations this check reads; any other type (str, Path, Literal, a class) may come from a
# config value in ways only its class knows, so a parameter annotated with one is never checked.
NUMBERS = (int, float, torch.Tensor)
CHECKED = (*NUMBERS, bool, NoneType)


def check_value_types(cfg: DictConfig) -> None:
    """A command-line value that its target's signature cannot take: one line naming the key.

    `trainer.max_epochs=abc` would otherwise fail deep inside Lightning. What a key takes is read
    from the annotation of the argument it sets, in the signature of its node's `_target_`:
    `int | None` takes a number or null, `float | Tensor` a number. Only annotations made of
    numbers, bools and None are checked, so that no value the target accepts is ever refused;
    the target's own validation does the rest. A key that another copies whole
    (`image_shape: ${data.image_shape}`) must suit that one's target too.
    """
    if not HydraConfig.initialized():
        return
    hydra_cfg = HydraConfig.get()
    groups = set(hydra_cfg.runtime.choices)
    given = {}
    for override in hydra_cfg.overrides.task:
        key, _, value = override.partition("=")
        key = key.lstrip("+")
        if not key.startswith("~") and key not in groups:
            given[key] = value
    if not given:
        return
    for key, value in given.items():
        _check_value(cfg, key, source=key, given=value)
    for user, source in _copies(OmegaConf.to_container(cfg, resolve=False), given):
        _check_value(cfg, user, source=source, given=given[source])


def _copies(node: object, keys: dict, path: str = "") -> list[tuple[str, str]]:
    """(key, source) for every value of the unresolved config that is exactly `${source}`."""
    found = []
    if isinstance(node, dict):
        for name, value in node.items():
            key = f"{path}.{name}" if path else str(name)
            whole = isinstance(value, str) and value.startswith("${") and value.endswith("}")
            if whole and value[2:-1] in keys:
                found.append((key, value[2:-1]))
            found += _copies(value, keys, key)
    return found


def _check_value(cfg: DictConfig, key: str, source: str, given: str) -> None:
    parent_key, _, name = key.rpartition(".")
    if parent_key:
        parent = OmegaConf.select(cfg, parent_key, throw_on_resolution_failure=False)
        target = parent.get("_target_") if isinstance(parent, DictConfig) else None
    else:
        target = TOP_LEVEL_TARGETS.get(name)
    if not isinstance(target, str):
        return
    annotation = _annotation(target, name)
    allowed = _checked_types(annotation)
    try:
        value = OmegaConf.select(cfg, key)
    except Exception:  # an interpolation that does not resolve: its own error says why
        return
    if not allowed or _accepts(allowed, value):
        return
    copied = f": {key} is ${{{source}}}" if key != source else ""
    signature = f"{target.rsplit('.', 1)[-1]}'s {name}: {_type_name(annotation)}"
    raise UserError(f"{source} must be {_described(allowed)}, got {given}{copied} ({signature}).")


def _annotation(target: str, name: str) -> object:
    """The annotation of argument `name` of the class or function `target` (None: unknown).

    A class whose `__init__` passes `**kwargs` on to its base is searched on in the base.
    """
    try:
        # kindling's locate, not Hydra's get_object: that one logs an error of its own.
        found = locate(target, key="")
    except Exception:  # not importable: building it says so, once
        return None
    for function in [c.__init__ for c in found.__mro__] if isinstance(found, type) else [found]:
        try:
            parameters = inspect.signature(function, eval_str=True).parameters
        except Exception:  # no signature, or annotations that do not evaluate
            return None
        if name in parameters:
            return parameters[name].annotation
        if not any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
            return None
    return None


def _checked_types(annotation: object) -> tuple[type, ...]:
    """The types of an annotation made of numbers, bools and None only; () for any other."""
    members = typing.get_args(annotation) if _is_union(annotation) else (annotation,)
    if not all(isinstance(m, type) and issubclass(m, CHECKED) for m in members):
        return ()
    return members


def _is_union(annotation: object) -> bool:
    return typing.get_origin(annotation) in (typing.Union, UnionType)


def _accepts(allowed: tuple[type, ...], value: object) -> bool:
    """Numbers and bools pass for any checked type (Python takes True as 1 and 0 as false);
    null only where the annotation has None; text never."""
    if value is None:
        return NoneType in allowed
    if isinstance(value, int | float):
        return True
    return not isinstance(value, str)  # a list or a config: left to the target


def _described(allowed: tuple[type, ...]) -> str:
    words = []
    if any(t is not bool and issubclass(t, NUMBERS) for t in allowed):
        words.append("a number")
    elif bool in allowed:
        words += ["true", "false"]
    if NoneType in allowed:
        words.append("null")
    return " or ".join(words) if len(words) < 3 else f"{', '.join(words[:-1])} or {words[-1]}"


def _type_name(annotation: object) -> str:
    if _is_union(annotation):
        return " | ".join(_type_name(m) for m in typing.get_args(annotation))
    return "None" if annotation is NoneType else getattr(annotation, "__name__", str(annotation))
