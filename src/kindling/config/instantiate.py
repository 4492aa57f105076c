"""Build objects from config, after checking each against its target's signature.

One mechanism words every config mistake as one line naming its key:
- before anything is built, `check_arguments` binds each object's config to its `_target_`'s
  signature: a target that does not exist (with the names it could be), an argument the target
  does not take, one it needs and is not given, a value of another type than it declares;
- while an object is built, or later when a `_partial_` factory is called (the optimizer in
  `configure_optimizers`), a `ValueError` or Lightning's `MisconfigurationException` (what
  argument checks raise, in torch, Lightning and kindling) names the key and the values set,
  and a missing package (`ImportError`) says so.
Everything else (a bug in a constructor, anything raised in `forward`) keeps its traceback.
"""

import contextlib
import difflib
import functools
import importlib
import inspect
import pkgutil
import re
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
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
    """`instantiate(node)` once `check_arguments` passed; a refused value is one line naming it.

    The objects nested in `node` (`model.net`) are built first, each under its own key. A
    `_partial_: true` one becomes a `ConfigFactory`, which names its key when it is called.
    `_convert_="all"`: objects get plain lists and dicts, never OmegaConf containers, so what
    they save into checkpoints loads with `torch.load(weights_only=True)`.
    """
    check_arguments(node, key, provided=kwargs)  # and every object nested in it
    return _build_checked(node, key, kwargs)


def _build_checked(node: DictConfig, key: str, kwargs: dict[str, Any]) -> Any:
    if node.get("_recursive_", True):
        for name, child in node.items():
            if name not in kwargs and isinstance(child, DictConfig) and "_target_" in child:
                kwargs[name] = _build_checked(child, f"{key}.{name}", {})
    try:
        built = instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as error:
        cause = error.__cause__
        if cause is None:  # Hydra's own refusal (a blocklisted target): its message is clear
            raise
        failure = find_user_error(cause) or refusal(cause, key, node._target_, _given(node))
        # Raised outside this block, so that Hydra's wrapper is not its context.
        failure = failure or cause
    else:
        if isinstance(built, functools.partial):
            return ConfigFactory(built, key, _given(node), node._target_)
        return built
    if failure is cause:
        raise failure
    raise failure from cause


def instantiate_group(group: DictConfig | None, key: str) -> list[Any]:
    """Build every entry of `{name: {_target_: ...}}` (callbacks, loggers); null entries are off.

    A user turns one entry off with `callbacks.early_stopping=null`.
    """
    if not group:
        return []
    return [build(entry, f"{key}.{name}") for name, entry in group.items() if entry is not None]


class ConfigFactory:
    """A `_partial_: true` object of the config at `key`: calling it builds the object, and a
    value refused then (`model.optimizer.lr=-1`, inside `trainer.fit`) names its key."""

    def __init__(self, partial: functools.partial, key: str, given: dict, name: str) -> None:
        self.partial, self.key, self.given, self.name = partial, key, given, name
        self.func, self.args, self.keywords = partial.func, partial.args, partial.keywords

    @property
    def __signature__(self) -> inspect.Signature:
        # What the partial still takes (e.g. a schedule's `total_steps`), for inspect.signature.
        return inspect.signature(self.partial)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.partial(*args, **kwargs)
        except (*REFUSALS, ImportError) as error:
            failure = refusal(error, self.key, self.name, self.given)
            if failure is None:
                raise
            raise failure from error

    def __repr__(self) -> str:
        return f"ConfigFactory({self.key}: {self.partial!r})"


# ------------------------------------------------------------------------------------------------
# Before building: the config against the signature


def check_arguments(node: Any, key: str, provided: Mapping[str, Any] = {}) -> None:
    """Every object under `node` (a config with `_target_`): its target exists, takes each
    argument given, is given each one it needs (unless `_partial_` or `provided` by the caller),
    and each value has the type the signature declares (where a plain value can be judged)."""
    if not isinstance(node, DictConfig):
        return
    if "_target_" not in node:
        for name, child in node.items():
            check_arguments(child, f"{key}.{name}")
        return
    target = locate(node._target_, key)
    name = node._target_
    try:
        arguments = _arguments(target)
    except (TypeError, ValueError):  # no signature to read (some builtins): judge nothing
        arguments = None
    given = _given(node)
    if arguments is not None:
        for argument, value in given.items():
            if argument not in arguments.names and not arguments.takes_any:
                raise UserError(
                    f"{key}.{argument}={_show(value)}: {name} takes no argument {argument!r} (it "
                    f"takes {', '.join(arguments.names)}). Remove {key}.{argument} or correct "
                    "its name."
                )
            hint = arguments.hints.get(argument)
            if hint is not None and not _matches(value, hint):
                raise UserError(
                    f"{key}.{argument}={_show(value)} has the wrong type: {name} takes "
                    f"{argument}: {_type_name(hint)}. Change {key}.{argument}."
                )
        if not node.get("_partial_", False):
            for argument in arguments.required:
                if argument not in given and argument not in node and argument not in provided:
                    raise UserError(
                        f"{key}: {name} needs {argument}. Add +{key}.{argument}=<value>."
                    )
    if node.get("_recursive_", True):
        for argument, child in node.items():
            if argument not in HYDRA_KEYS and argument not in provided:
                check_arguments(child, f"{key}.{argument}")


def locate(path: Any, key: str) -> Any:
    """What `_target_` names (`torch.optim.AdamW`); a UserError if it names nothing."""
    if not isinstance(path, str):
        return path
    parts = path.split(".")
    for depth in range(len(parts), 0, -1):
        name = ".".join(parts[:depth])
        try:
            found = importlib.import_module(name)
        except ModuleNotFoundError as error:
            # A module the path names is missing: try its parent. A module that one imports is
            # missing: that is the error.
            if error.name is None or not (name + ".").startswith(error.name + "."):
                raise
            continue
        for attribute in parts[depth:]:
            if not hasattr(found, attribute):
                raise UserError(
                    f"{key}._target_={path}: {_has_no(found, attribute)}. Change {key}._target_."
                )
            found = getattr(found, attribute)
        return found
    raise UserError(f"{key}._target_={path}: there is no module {parts[0]}. Change {key}._target_.")


def _has_no(owner: Any, attribute: str) -> str:
    """`kindling.models has no Nope (it has CNNClassifier, ...)`, or the closest names."""
    names = getattr(owner, "__all__", None)
    if names is None:
        names = [n for n, v in vars(owner).items() if not n.startswith("_") and inspect.isclass(v)]
        if hasattr(owner, "__path__"):  # a package: its modules too
            names += [m.name for m in pkgutil.iter_modules(owner.__path__)]
    text = f"{getattr(owner, '__name__', owner)} has no {attribute}"
    if len(names) <= 16:
        return f"{text} (it has {', '.join(sorted(names))})"
    close = difflib.get_close_matches(attribute, names, n=3)
    return f"{text} (did you mean {' or '.join(close)}?)" if close else text


@dataclass
class Arguments:
    """What a target's signature says: the named arguments it takes, whether `**kwargs` takes
    any other, the ones it needs, and their declared types."""

    names: list[str]
    takes_any: bool
    required: list[str]
    hints: dict[str, Any]


def _arguments(target: Callable[..., Any]) -> Arguments:
    """The target's signature; a class's `**kwargs` followed into its parents' `__init__`
    (DigitsDataModule -> InMemoryImageDataModule)."""
    functions = [target]
    if isinstance(target, type):
        functions = [c.__init__ for c in target.__mro__ if "__init__" in vars(c)]
    names: list[str] = []
    hints: dict[str, Any] = {}
    required: list[str] | None = None
    for function in functions:
        parameters = list(inspect.signature(function).parameters.values())
        named = [
            p for p in parameters
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
        ]  # fmt: skip
        if required is None:  # the target's own signature says what it needs
            required = [p.name for p in named if p.default is p.empty]
        names += [p.name for p in named if p.name not in names]
        with contextlib.suppress(Exception):  # hints that do not evaluate: judge none of these
            hints = {**typing.get_type_hints(function), **hints}  # a subclass's own wins
        takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters)
        if not takes_any:
            break
    return Arguments(names, takes_any, required or [], hints)


def _matches(value: Any, hint: Any) -> bool:
    """Whether `value` (plain, from YAML) has type `hint`; True where that cannot be told."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, UnionType):
        return any(_matches(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if hint in (None, type(None)):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint is bool:
        return isinstance(value, bool)
    if hint is torch.Tensor:  # `lr: float | Tensor`: from a config, a number
        return isinstance(value, int | float) and not isinstance(value, bool)
    if origin in (list, tuple, Sequence) or hint in (list, tuple, Sequence):
        items = [a for a in args if a is not Ellipsis]
        return isinstance(value, list | tuple) and all(
            any(_matches(v, a) for a in items) for v in value if items
        )
    # A string, a path, a class...: any value may be meant for it, and its own code judges it.
    return True


def _type_name(hint: Any) -> str:
    text = hint.__name__ if isinstance(hint, type) else str(hint)
    return re.sub(r"\b(typing|collections\.abc)\.", "", text)


# ------------------------------------------------------------------------------------------------
# While building: a value the target refused


def refusal(
    error: BaseException, key: str, name: str, given: Mapping[str, Any]
) -> UserError | None:
    """The one line for `error`, raised by the target of the config at `key` refusing its
    values; None if it is not a refusal (a bug keeps its traceback)."""
    if isinstance(error, ImportError):  # `logger=wandb` without wandb installed
        return UserError(f"{key} ({name}) needs a package that is missing: {_reason(error)}.")
    if not isinstance(error, REFUSALS):
        return None
    overrides = _overrides_under(key)
    suspect = _suspect(str(error), given, overrides)
    if suspect is not None:
        return UserError(
            f"{key}.{suspect}={_show(given[suspect])} is refused by {name}: {_reason(error)}. "
            f"Change {key}.{suspect}."
        )
    values = overrides or [f"{key}.{k}={_show(v)}" for k, v in given.items()]
    return UserError(
        f"{key} ({name}) refused its values: {_reason(error)}. Check the values under {key}"
        f"{'; you set ' if overrides else ': '}{', '.join(values)}."
    )


def _suspect(message: str, given: Mapping[str, Any], overrides: list[str]) -> str | None:
    """The one argument the message names, or whose value it quotes, if any; of several named,
    the one set on the command line."""
    named = [a for a in given if re.search(rf"\b{re.escape(a)}\b", message)]
    if len(named) > 1:
        named = [a for a in named if any(o.split("=")[0].endswith(f".{a}") for o in overrides)]
    if len(named) == 1:
        return named[0]
    quoted = [
        a
        for a, v in given.items()
        if isinstance(v, int | float | str)
        and not isinstance(v, bool)
        and str(v)
        and re.search(rf"(?<![\w.]){re.escape(str(v))}(?![\w.])", message)
    ]
    return quoted[0] if len(quoted) == 1 else None


def _overrides_under(key: str) -> list[str]:
    """The command-line overrides of keys under `key` (`model.net.num_heads=3`)."""
    if not HydraConfig.initialized():
        return []
    overrides = [o.lstrip("+") for o in HydraConfig.get().overrides.task if "=" in o]
    return [o for o in overrides if o.startswith(f"{key}.")]


def _given(node: DictConfig) -> dict[str, Any]:
    """The arguments `node` gives as plain values (nested objects left out)."""
    values = OmegaConf.to_container(node, resolve=True)
    return {k: v for k, v in values.items() if k not in HYDRA_KEYS and not _holds_objects(v)}


def _holds_objects(value: Any) -> bool:
    """Whether `value` holds configs of objects (`trainer.plugins`), which Hydra builds."""
    if isinstance(value, dict):
        return "_target_" in value or any(_holds_objects(v) for v in value.values())
    return isinstance(value, list) and any(_holds_objects(v) for v in value)


def _show(value: Any) -> str:
    """A value as it would be written on the command line."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list | tuple):
        return f"[{', '.join(_show(v) for v in value)}]"
    return str(value)


def _reason(error: BaseException) -> str:
    text = " ".join(str(error).split()) or type(error).__name__
    return text.rstrip(".")
