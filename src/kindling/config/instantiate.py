"""Build objects from config, each config bound to its target's signature first (torchtune's
check): a missing target, an unknown or missing argument, or a value a simple hint refuses is one
line naming the key; so is a value the target refuses when built (the library's own message) or
a missing package. Anything else (a bug in a constructor) keeps its traceback."""

import functools
import importlib
import inspect
import json
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

from kindling.errors import UserError, find_user_error

# Keys of an object's config that are Hydra's, not arguments of the object.
HYDRA_KEYS = ("_target_", "_partial_", "_recursive_", "_convert_", "_args_")
# What argument checks raise when they refuse a value, and what a missing package raises.
REFUSALS = (ValueError, MisconfigurationException, ImportError)


def build(node: DictConfig, key: str, **kwargs: Any) -> Any:
    """`instantiate(node)` into plain lists and dicts (`_convert_="all"`: checkpoints load them
    with `weights_only=True`), its nested objects built first so that a refusal names the one
    that refused; a `_partial_: true` one becomes a `ConfigFactory`."""
    if node.get("_recursive_", True):
        for name, child in node.items():
            if name not in kwargs and isinstance(child, DictConfig) and "_target_" in child:
                kwargs[name] = build(child, f"{key}.{name}")
    try:
        built = instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as error:
        cause = error.__cause__
        if cause is None:  # Hydra's own refusal (a blocklisted target): clear as it is
            raise
    else:
        if isinstance(built, functools.partial):
            factory = ConfigFactory(built.func, *built.args, **built.keywords)
            factory.key, factory.target = key, node._target_
            return factory
        return built
    # Raised outside the except block, so that Hydra's wrapper is not its context.
    user_error = find_user_error(cause)
    if user_error is None and isinstance(cause, REFUSALS):
        user_error = refused(cause, key, node._target_)
    if user_error is None or user_error is cause:
        raise cause
    raise user_error from cause


def instantiate_group(group: DictConfig | None, key: str) -> list[Any]:
    """Every entry of `{name: {_target_: ...}}` (callbacks, loggers) but the null ones, and
    those whose target returns None (a switched-off callback, not built)."""
    entries = {name: entry for name, entry in (group or {}).items() if entry is not None}
    built = (build(entry, f"{key}.{name}") for name, entry in entries.items())
    return [thing for thing in built if thing is not None]


class ConfigFactory(functools.partial):
    """A `_partial_: true` object at `key`: a value refused when it is called (inside
    `trainer.fit`) names its key."""

    key: str
    target: str

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().__call__(*args, **kwargs)
        except REFUSALS as error:
            raise refused(error, self.key, self.target) from error


def refused(error: BaseException, key: str, target: str) -> UserError:
    """One line: the object at `key`, the library's message, the values the command line set."""
    reason = (" ".join(str(error).split()) or type(error).__name__).rstrip(".")
    if isinstance(error, ImportError):  # `logger=wandb` without wandb installed
        return UserError(f"{key} ({target}) needs a package that is missing: {reason}.")
    given = HydraConfig.get().overrides.task if HydraConfig.initialized() else []
    you_set = ", ".join(o.lstrip("+") for o in given if o.lstrip("+").startswith(f"{key}."))
    you_set = f"; you set {you_set}" if you_set else ""
    return UserError(
        f"{key} ({target}) refused its values: {reason}. Check the values under {key}{you_set}."
    )


def check_arguments(node: Any, key: str) -> None:
    """Bind every object's config under `node` to its target's signature."""
    if not isinstance(node, DictConfig):
        return
    if "_target_" in node:
        _bind(node, key)
        if not node.get("_recursive_", True):
            return
    for name, child in node.items():  # Hydra's keys hold no config: `_args_` is a list
        check_arguments(child, f"{key}.{name}")


def _bind(node: DictConfig, key: str) -> None:
    """One object's own arguments against its target's signature."""
    name = node._target_
    parameters, takes_any, needed = _signature(locate(name, key))
    values = OmegaConf.to_container(node, resolve=True)
    for argument, value in values.items():
        parameter = parameters.get(argument)
        if argument in HYDRA_KEYS or (parameter is None and takes_any):
            continue
        shown = value if isinstance(value, str) else json.dumps(value, default=str)  # as typed
        given = f"{key}.{argument}={shown}"
        if parameter is None:
            raise UserError(
                f"{given}: {name} takes no argument {argument!r} (it takes "
                f"{', '.join(parameters)}). Remove {key}.{argument} or correct its name."
            )
        if not _has_type(value, parameter.annotation):
            hint = inspect.formatannotation(parameter.annotation)
            hint = hint.replace("typing.", "").replace("collections.abc.", "")
            raise UserError(
                f"{given} has the wrong type: {name} takes {argument}: {hint}. Change "
                f"{key}.{argument}."
            )
    missing = [a for a in needed if a not in node]
    if missing and not node.get("_partial_", False):
        raise UserError(f"{key}: {name} needs {missing[0]}. Add +{key}.{missing[0]}=<value>.")


def locate(path: str, key: str) -> Any:
    """What `_target_` names (`torch.optim.AdamW`); a UserError if it names nothing."""
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
    if hasattr(module, attribute):
        return getattr(module, attribute)
    # What the module defines, not what it imports; listed where that is short.
    names = getattr(module, "__all__", None) or [
        n for n, v in vars(module).items() if getattr(v, "__module__", None) == module_name
    ]
    has = f" (it has {', '.join(sorted(names))})" if len(names) <= 16 else ""
    raise UserError(
        f"{key}._target_={path}: {module_name} has no {attribute}{has}. Change {key}._target_."
    )


def _signature(target: Any) -> tuple[dict[str, inspect.Parameter], bool, list[str]]:
    """The named arguments `target` takes, whether it takes any other name, and those it needs;
    a class's `__init__` that passes `**kwargs` on takes its parents' too."""
    functions = [target]
    if isinstance(target, type):
        functions = [c.__init__ for c in target.__mro__ if "__init__" in vars(c)]
    parameters: dict[str, inspect.Parameter] = {}
    needed = None
    for function in functions:
        try:
            signature = inspect.signature(function).parameters.values()
        except (TypeError, ValueError):  # no signature to read (some builtins): takes anything
            return parameters, True, needed or []
        named = [p for p in signature if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
        named = [p for p in named if p.name != "self"]
        if needed is None:
            needed = [p.name for p in named if p.default is p.empty]
        for p in named:
            parameters.setdefault(p.name, p)
        if not any(p.kind is p.VAR_KEYWORD for p in signature):
            return parameters, False, needed
    return parameters, True, needed or []


def _has_type(value: Any, hint: Any) -> bool:
    """Whether a plain YAML value has type `hint`; True where the hint is not simple to judge."""
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
