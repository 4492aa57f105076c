"""Build objects from config; each config checked against its target's signature beforehand.

Every config mistake is one line naming its key:
- `check_arguments`, before anything is built (`kindling.train._check`), reads each object's
  config against its `_target_`'s signature: a target that does not exist, an argument it does
  not take, one it needs and is not given, a plain value of another type than it declares;
- `build`: a `ValueError` or Lightning's `MisconfigurationException` raised while the object is
  built, or later when a `_partial_` factory is called (the optimizer in `configure_optimizers`),
  is the target refusing its values (what argument checks raise, in torch, Lightning and
  kindling): the key and the library's message. A missing package (`ImportError`) says so.
Everything else (a bug in a constructor, anything raised in `forward`) keeps its traceback.
"""

import difflib
import functools
import importlib
import inspect
import re
import typing
from collections.abc import Sequence
from types import UnionType
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from hydra.utils import instantiate
from lightning.fabric.utilities.exceptions import MisconfigurationException
from omegaconf import DictConfig, OmegaConf

from kindling.config.errors import UserError, find_user_error

# Keys of an object's config that are Hydra's, not arguments of the object.
HYDRA_KEYS = ("_target_", "_partial_", "_recursive_", "_convert_", "_args_")
# What argument checks raise when they refuse a value.
REFUSALS = (ValueError, MisconfigurationException)


def build(node: DictConfig, key: str, **kwargs: Any) -> Any:
    """`instantiate(node)`, for a config `check_arguments` passed; a refused value is one line.

    The objects nested in `node` (`model.net`) are built first, each under its own key; a
    `_partial_: true` one becomes a `ConfigFactory`, which names its key when it is called.
    `_convert_="all"`: objects get plain lists and dicts, never OmegaConf containers, so what
    they save into checkpoints loads with `torch.load(weights_only=True)`.
    """
    if node.get("_recursive_", True):
        for name, child in node.items():
            if name not in kwargs and isinstance(child, DictConfig) and "_target_" in child:
                kwargs[name] = build(child, f"{key}.{name}")
    try:
        built = instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as error:
        if error.__cause__ is None:  # Hydra's own refusal (a blocklisted target): clear as it is
            raise
        cause = error.__cause__
    else:
        if isinstance(built, functools.partial):
            factory = ConfigFactory(built.func, *built.args, **built.keywords)
            factory.key, factory.target = key, node._target_
            return factory
        return built
    # Raised outside the except block, so that Hydra's wrapper is not its context.
    failure = find_user_error(cause) or _refusal(cause, key, built_from=node._target_)
    if failure is None or failure is cause:
        raise cause
    raise failure from cause


def instantiate_group(group: DictConfig | None, key: str) -> list[Any]:
    """Build every entry of `{name: {_target_: ...}}` (callbacks, loggers); null entries are off.

    A user turns one entry off with `callbacks.early_stopping=null`.
    """
    if not group:
        return []
    return [build(entry, f"{key}.{name}") for name, entry in group.items() if entry is not None]


class ConfigFactory(functools.partial):
    """A `_partial_: true` object of the config at `key`: calling it builds the object, and a
    value refused then (`model.optimizer.lr=-1`, inside `trainer.fit`) names its key."""

    key: str
    target: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except (*REFUSALS, ImportError) as error:
            raise _refusal(error, self.key, built_from=self.target) from error


def _refusal(error: BaseException, key: str, built_from: str) -> UserError | None:
    """The one line for `error` raised by the target of the config at `key`, with the values the
    command line set under it; None if it is not a refusal (a bug keeps its traceback)."""
    if isinstance(error, ImportError):  # `logger=wandb` without wandb installed
        return UserError(f"{key} ({built_from}) needs a package that is missing: {_reason(error)}.")
    if not isinstance(error, REFUSALS):
        return None
    overrides = []
    if HydraConfig.initialized():
        overrides = [o.lstrip("+") for o in HydraConfig.get().overrides.task]
        overrides = [o for o in overrides if o.startswith(f"{key}.")]
    you_set = f"; you set {', '.join(overrides)}" if overrides else ""
    return UserError(
        f"{key} ({built_from}) refused its values: {_reason(error)}. Check the values under "
        f"{key}{you_set}."
    )


def _reason(error: BaseException) -> str:
    return (" ".join(str(error).split()) or type(error).__name__).rstrip(".")


# ------------------------------------------------------------------------------------------------
# Before building: the config against the signature


def check_arguments(node: Any, key: str) -> None:
    """Every object under `node` (a config with `_target_`): its target exists, takes each
    argument given, is given each one it needs (unless `_partial_`), and each plain value has
    the type the signature declares (numbers, bools, None, `Literal`, lists)."""
    if not isinstance(node, DictConfig):
        return
    if "_target_" not in node:
        for name, child in node.items():
            check_arguments(child, f"{key}.{name}")
        return
    target, name = locate(node._target_, key), node._target_
    parameters, takes_any = _parameters(target)
    values = OmegaConf.to_container(node, resolve=True)
    given = {k: v for k, v in values.items() if k not in HYDRA_KEYS}
    for argument, value in given.items():
        if argument not in parameters and not takes_any:
            raise UserError(
                f"{key}.{argument}={_show(value)}: {name} takes no argument {argument!r} (it "
                f"takes {', '.join(parameters)}). Remove {key}.{argument} or correct its name."
            )
        hint = parameters[argument].annotation if argument in parameters else None
        if hint is not None and not _has_type(value, hint):
            raise UserError(
                f"{key}.{argument}={_show(value)} has the wrong type: {name} takes "
                f"{argument}: {_type_name(hint)}. Change {key}.{argument}."
            )
    if not node.get("_partial_", False):
        for argument in _needed(target):
            if argument not in node:
                raise UserError(f"{key}: {name} needs {argument}. Add +{key}.{argument}=<value>.")
    if node.get("_recursive_", True):
        for argument, child in node.items():
            if argument not in HYDRA_KEYS:
                check_arguments(child, f"{key}.{argument}")


def locate(path: Any, key: str) -> Any:
    """What `_target_` names (`torch.optim.AdamW`); a UserError if it names nothing."""
    if not isinstance(path, str):
        return path
    module_name, _, attribute = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:
        # A module the path names is missing; one that module imports is another error.
        if error.name is None or not (module_name + ".").startswith(error.name + "."):
            raise
        raise UserError(
            f"{key}._target_={path}: there is no module {error.name}. Change {key}._target_."
        ) from None
    if not hasattr(module, attribute):
        raise UserError(
            f"{key}._target_={path}: {_has_no(module, attribute)}. Change {key}._target_."
        )
    return getattr(module, attribute)


def _has_no(module: Any, attribute: str) -> str:
    """`kindling.models has no Nope (it has CNNClassifier, ...)`, or the closest names."""
    names = getattr(module, "__all__", None)
    if names is None:  # what the module defines, not what it imports
        names = [
            n
            for n, v in vars(module).items()
            if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
        ]
    text = f"{module.__name__} has no {attribute}"
    if len(names) <= 16:
        return f"{text} (it has {', '.join(sorted(names))})"
    close = difflib.get_close_matches(attribute, names, n=3)
    return f"{text} (did you mean {' or '.join(close)}?)" if close else text


def _functions(target: Any) -> list[Any]:
    """The functions a config's arguments go to: a class's `__init__` and, while it passes
    `**kwargs` on, its parents' (DigitsDataModule -> InMemoryImageDataModule)."""
    if isinstance(target, type):
        return [c.__init__ for c in target.__mro__ if "__init__" in vars(c)]
    return [target]


def _named(function: Any) -> list[inspect.Parameter]:
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):  # no signature to read (some builtins): takes anything
        return [inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD)]
    keyword = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [
        p for p in parameters if p.name != "self" and (p.kind in keyword or p.kind is p.VAR_KEYWORD)
    ]


def _parameters(target: Any) -> tuple[dict[str, inspect.Parameter], bool]:
    """The named arguments `target` takes (a subclass's own first), and whether it takes any
    other name (`**kwargs` that no parent's signature ends)."""
    parameters: dict[str, inspect.Parameter] = {}
    for function in _functions(target):
        named = _named(function)
        for p in named:
            if p.kind is not p.VAR_KEYWORD:
                parameters.setdefault(p.name, p)
        if not any(p.kind is p.VAR_KEYWORD for p in named):
            return parameters, False
    return parameters, True


def _needed(target: Any) -> list[str]:
    """The arguments the target's own signature needs (its parents' it may pass itself)."""
    named = _named(_functions(target)[0])
    return [p.name for p in named if p.kind is not p.VAR_KEYWORD and p.default is p.empty]


def _has_type(value: Any, hint: Any) -> bool:
    """Whether `value` (plain, from YAML) has type `hint`; True where a hint says nothing a YAML
    value can be judged by (a string, a path, a class: its own code judges it)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, UnionType):
        return any(_has_type(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if hint in (None, type(None)):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint in (int, float, torch.Tensor):  # a Tensor (`lr: float | Tensor`) is a number here
        number = int if hint is int else int | float
        return isinstance(value, number) and not isinstance(value, bool)
    if (origin or hint) in (list, tuple, Sequence):
        return isinstance(value, list | tuple)
    return True


def _type_name(hint: Any) -> str:
    text = hint.__name__ if isinstance(hint, type) else str(hint)
    return re.sub(r"\b(typing|collections\.abc)\.", "", text)


def _show(value: Any) -> str:
    """A value as it would be written on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return f"[{', '.join(_show(v) for v in value)}]"
    return str(value)
