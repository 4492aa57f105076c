"""Build objects from config, turning a config mistake into a message that names its key."""

import difflib
import functools
import importlib
import inspect
import pkgutil
from typing import Any

from hydra.errors import InstantiationException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from kindling.config.errors import REFUSALS, UserError, config_mistake, find_user_error

# Keys of an object's config that are Hydra's, not arguments of the object.
HYDRA_KEYS = ("_target_", "_partial_", "_recursive_", "_convert_", "_args_")


def build(node: DictConfig, key: str, **kwargs: Any) -> Any:
    """`instantiate(node)`, where a config mistake becomes one line naming its key and value:
    `model.optimizer.lr=-1 is refused by torch.optim.AdamW: Invalid learning rate: -1`.

    The objects nested in `node` (`model.net`) are built first, each under its own key. A
    `_partial_: true` one becomes a `ConfigFactory`, which names its key when it is called later
    (the optimizer, in `configure_optimizers` inside `trainer.fit`). What counts as a config
    mistake is `kindling.config.errors.config_mistake`; other errors keep their traceback.

    `_convert_="all"`: objects get plain lists and dicts, never OmegaConf containers, so what
    they save into checkpoints loads with `torch.load(weights_only=True)`.
    """
    target = locate(node.get("_target_"), key)
    if node.get("_recursive_", True):
        for name, child in node.items():
            if name not in kwargs and isinstance(child, DictConfig) and "_target_" in child:
                kwargs[name] = build(child, f"{key}.{name}")
    try:
        built = instantiate(node, _convert_="all", **kwargs)
    except InstantiationException as error:
        cause = error.__cause__
        if cause is None:  # Hydra's own refusal (a blocklisted target): its message is clear
            raise
        failure = find_user_error(cause)
        if failure is None:
            given = _given(node, kwargs)
            arguments = {**given, **kwargs}
            failure = config_mistake(cause, key, target, arguments, given, node._target_)
            if failure is not None:
                raise failure from cause
        # A bug, or a UserError raised inside: raised as itself, without Hydra's wrapper (which
        # shows no traceback), outside this block (so it is not its own context).
        failure = failure or cause
    else:
        if isinstance(built, functools.partial):
            return ConfigFactory(built, key, _given(node, kwargs), node._target_)
        return built
    raise failure


class ConfigFactory:
    """A `_partial_: true` object of the config at `key`: calling it builds the object.

    A config mistake that shows only then (`model.optimizer.lr=-1` when `configure_optimizers`
    calls it inside `trainer.fit`, a net built once the vocabulary is known) becomes a UserError
    naming the key, as in `build`. `func`, `args` and `keywords` are the partial's.
    """

    def __init__(
        self, partial: functools.partial, key: str, given: dict[str, Any], name: str
    ) -> None:
        self.partial, self.key, self.given, self.name = partial, key, given, name

    @property
    def func(self) -> Any:
        return self.partial.func

    @property
    def args(self) -> tuple[Any, ...]:
        return self.partial.args

    @property
    def keywords(self) -> dict[str, Any]:
        return self.partial.keywords

    @property
    def __signature__(self) -> inspect.Signature:
        # What the partial still takes (e.g. a schedule's `total_steps`), for inspect.signature;
        # with an argument its target does not take, the target's own (calling it says why).
        try:
            return inspect.signature(self.partial)
        except ValueError:
            return inspect.signature(self.partial.func)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return self.partial(*args, **kwargs)
        except REFUSALS as error:
            arguments = {**self.partial.keywords, **kwargs}
            target = self.partial.func
            mistake = config_mistake(error, self.key, target, arguments, self.given, self.name)
            if mistake is None:
                raise
            raise mistake from error

    def __repr__(self) -> str:
        return f"ConfigFactory({self.key}: {self.partial!r})"


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
    """`kindling.models has no Nope (it has CNNClassifier, ...)`."""
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


def _given(node: DictConfig, built: dict[str, Any]) -> dict[str, Any]:
    """The arguments `node` gives as plain values (nested objects, built, left out)."""
    values = OmegaConf.to_container(node, resolve=True)
    return {
        k: v
        for k, v in values.items()
        if k not in HYDRA_KEYS and k not in built and not _holds_objects(v)
    }


def _holds_objects(value: Any) -> bool:
    """Whether `value` holds configs of objects (`trainer.plugins`), which Hydra builds."""
    if isinstance(value, dict):
        return "_target_" in value or any(_holds_objects(v) for v in value.values())
    return isinstance(value, list) and any(_holds_objects(v) for v in value)


def instantiate_group(group: DictConfig | None, key: str) -> list[Any]:
    """Build every entry of `{name: {_target_: ...}}` (callbacks, loggers); null entries are off.

    A user turns one entry off with `callbacks.early_stopping=null`.
    """
    if not group:
        return []
    return [build(entry, f"{key}.{name}") for name, entry in group.items() if entry is not None]
