"""Errors caused by input a user can fix: printed as one short message, without a traceback.

`config_mistake` decides whether an exception raised while building an object from config is
the config's fault, and words the message that names the key and the value.
"""

import collections.abc
import dis
import inspect
import os
import re
import site
import sysconfig
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from lightning.fabric.utilities.exceptions import MisconfigurationException


class UserError(CompactHydraException):
    """Bad configuration or missing files: the message names the problem and the fix.

    A CompactHydraException: where one leaves a Hydra job (the end of a multirun), Hydra prints
    its message alone, and the whole traceback with HYDRA_FULL_ERROR=1.
    """

    # Every process of a multi-device run reads the same config and data, so raises the same
    # error: rank 0 alone prints it. An error that only some processes raise sets False.
    raised_on_every_rank = True


def find_user_error(error: BaseException) -> UserError | None:
    """The UserError behind `error`, also when Hydra's instantiate wrapped it in its own."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, UserError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


# What a constructor raises when it refuses its arguments (Lightning's own checks raise
# MisconfigurationException; torch's modules also RuntimeError and AssertionError).
REFUSALS = (
    TypeError,
    ValueError,
    RuntimeError,
    AssertionError,
    ImportError,
    MisconfigurationException,
)


def config_mistake(
    error: BaseException,
    key: str,
    target: Callable[..., Any],
    arguments: Mapping[str, Any],
    given: Mapping[str, Any],
    name: str | None = None,
) -> UserError | None:
    """The one-line UserError for `error`, raised by `target(**arguments)` built from the config
    at `key` (`given`: the plain values that came from the config, `name`: its `_target_`);
    None if the config is not to blame.

    The config is to blame when:
    - its arguments do not fit the target's signature (an unknown or a missing argument);
    - a value given is not of the type the target's signature declares (`channels: Sequence[int]`
      given 5);
    - a library refused a value: the exception was raised inside an installed package or the
      standard library (torch, Lightning, torchvision check their arguments: `lr=-1`,
      `num_layers=0`), also when the project's code handed the value on;
    - the project's own code refused a value with a `raise ValueError(...)` or
      `raise TypeError(...)` statement: an argument check (`d_model must be divisible by
      num_heads`).
    Anything else raised in the project's code (an operation that failed in a net's
    constructor: an unpacking, an index, a call with wrong arguments, while every value has its
    declared type) is a bug, not a config mistake, and keeps its traceback; so does everything
    raised later, in `forward` or a training step. A bug in a constructor that hands a library
    a bad value of its own reads as a config mistake of that object: HYDRA_FULL_ERROR=1 shows
    where it was raised.
    """
    if not isinstance(error, REFUSALS) or isinstance(error, UserError):
        return None
    name = name or _dotted_name(target)
    unknown = _unknown_argument(error, target, given)
    if unknown is not None:
        return UserError(
            f"{key}.{unknown}={_show(given[unknown])}: {name} takes no argument {unknown!r} "
            f"(it takes {', '.join(_parameters(target))}). Remove {key}.{unknown} or correct "
            "its name."
        )
    missing = _missing_argument(target, arguments)
    if missing is not None:
        return UserError(f"{key}: {name} needs {missing}. Add +{key}.{missing}=<value>.")
    hints = _type_hints(target)
    for argument, value in given.items():
        hint = hints.get(argument)
        if hint is not None and not _matches(value, hint):
            return UserError(
                f"{key}.{argument}={_show(value)} has the wrong type: {name} takes "
                f"{argument}: {_type_name(hint)} ({_reason(error)}). Change {key}.{argument}."
            )
    if not (_raised_in_library(error) or _raised_by_check(error)):
        return None
    if isinstance(error, ImportError):  # `logger=wandb` without wandb installed
        return UserError(f"{key} ({name}) needs a package that is missing: {_reason(error)}.")
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


# ------------------------------------------------------------------------------------------------
# Which argument, which kind of failure


def _parameters(target: Callable[..., Any]) -> list[str]:
    """The named arguments `target` takes. A class's `**kwargs` is followed into its parents'
    `__init__` (DigitsDataModule -> ImageDataModule)."""
    if isinstance(target, type):
        functions = [c.__init__ for c in target.__mro__ if "__init__" in vars(c)]
    else:
        functions = [target]
    names: list[str] = []
    for function in functions:
        try:
            parameters = list(inspect.signature(function).parameters.values())
        except (TypeError, ValueError):  # no signature to read (some builtins)
            break
        names += [
            p.name
            for p in parameters
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in names
        ]
        if not any(p.kind is p.VAR_KEYWORD for p in parameters):
            break
    return [n for n in names if n != "self"]


def _unknown_argument(
    error: BaseException, target: Callable[..., Any], given: Mapping[str, Any]
) -> str | None:
    """An argument given that the target does not take, in Python's words as it was passed
    (by the call, or by a class handing its `**kwargs` on to its parent's `__init__`). One that
    the target does take was refused deeper, by a call of the target's own."""
    unknown = re.search(r"unexpected keyword argument '(\w+)'", str(error))
    if not (isinstance(error, TypeError) and unknown) or unknown.group(1) not in given:
        return None
    return None if unknown.group(1) in _parameters(target) else unknown.group(1)


def _missing_argument(target: Callable[..., Any], arguments: Mapping[str, Any]) -> str | None:
    try:
        inspect.signature(target).bind(**arguments)
    except TypeError as unfit:
        missing = re.search(r"missing a required argument: '(\w+)'", str(unfit))
        return missing.group(1) if missing else None
    except ValueError:  # no signature to read (some builtins)
        return None
    return None


def _suspect(message: str, given: Mapping[str, Any], overrides: list[str]) -> str | None:
    """The one argument the library's message names, or whose value it quotes, if any; of
    several named, the one set on the command line."""
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


_KINDLING = str(Path(__file__).resolve().parents[1]) + os.sep
_LIBRARIES = tuple(
    {
        str(Path(p).resolve()) + os.sep
        for p in [
            *(sysconfig.get_paths()[n] for n in ("stdlib", "platstdlib", "purelib", "platlib")),
            *site.getsitepackages(),
            site.getusersitepackages(),
        ]
    }
)


def _innermost(error: BaseException) -> types.TracebackType | None:
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb


def _raised_in_library(error: BaseException) -> bool:
    tb = _innermost(error)
    if tb is None:
        return False
    file = tb.tb_frame.f_code.co_filename
    if file.startswith("<"):  # frozen standard modules
        return True
    path = str(Path(file).resolve())
    return not path.startswith(_KINDLING) and path.startswith(_LIBRARIES)


def _raised_by_check(error: BaseException) -> bool:
    """A `raise ValueError(...)` / `raise TypeError(...)` statement, not a failed operation."""
    tb = _innermost(error)
    if tb is None or not isinstance(error, TypeError | ValueError):
        return False
    for instruction in dis.get_instructions(tb.tb_frame.f_code):
        if instruction.offset == tb.tb_lasti:
            return instruction.opname == "RAISE_VARARGS"
    return False


# ------------------------------------------------------------------------------------------------
# Types, as the target's signature declares them


def _type_hints(target: Callable[..., Any]) -> dict[str, Any]:
    function = target.__init__ if isinstance(target, type) else target
    try:
        return typing.get_type_hints(function)
    except Exception:  # hints that do not evaluate: judge no types
        return {}


_SEQUENCES = (list, tuple, collections.abc.Sequence, collections.abc.MutableSequence)


def _matches(value: Any, hint: Any) -> bool:
    """Whether `value` (plain, from YAML) has type `hint`; True where that cannot be told."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in args)
    if origin is typing.Literal:
        return value in args
    if hint in (None, type(None)):
        return value is None
    if hint is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin in _SEQUENCES or hint in _SEQUENCES:
        items = [a for a in args if a is not Ellipsis]
        return isinstance(value, list | tuple) and all(
            any(_matches(v, a) for a in items) for v in value if items
        )
    if isinstance(origin, type):
        return isinstance(value, origin)
    if isinstance(hint, type) and hint is not typing.Any:
        return isinstance(value, hint)
    return True


def _type_name(hint: Any) -> str:
    text = hint.__name__ if isinstance(hint, type) else str(hint)
    return re.sub(r"\b(typing|collections\.abc)\.", "", text)


# ------------------------------------------------------------------------------------------------
# Words


def _dotted_name(target: Callable[..., Any]) -> str:
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None) or repr(target)
    return f"{module}.{name}" if module and module != "builtins" else name


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
