"""Every place kindling relies on a private part of Hydra, each checked before it is patched.

- A single run composes its config once, not twice. Hydra 1.3's `_run_hydra` asks
  `Hydra.get_mode(config_name, overrides)` whether to run or sweep, which composes the whole
  config (all of configs/ read and merged again) only to read `hydra.mode`; then `Hydra.run`
  composes it a second time through `ConfigLoaderImpl.load_configuration`. `get_mode` below
  composes it as the single run will (run mode, sweep overrides refused) and hands that config
  to the run's own `load_configuration` call. A config that sweeps (`-m`, `hydra.mode:
  MULTIRUN` as in hparams_search=optuna) or that composes only for a sweep (`a=1,2`) is
  composed by Hydra as before.

A Hydra release that renamed these would leave the patch inert (or wrong), so the run stops
with one message naming the Hydra version instead. `pyproject.toml` bounds hydra-core to the
minor version the tests were run with (1.3.8).
"""

import functools
import inspect
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hydra
from hydra._internal import utils as hydra_utils
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.hydra import Hydra
from hydra.types import RunMode
from omegaconf import DictConfig

from kindling.utils.errors import UserError
from kindling.utils.internals import calls, requirement

# The minor version the tests ran with; keep in step with `hydra-core` in pyproject.toml.
SUPPORTED = "hydra-core>=1.3.8,<1.4"


class HydraInternalsChanged(UserError):
    """A private part of Hydra that kindling patches is not what kindling expects."""


_require = requirement(HydraInternalsChanged, "hydra-core", hydra.__version__, SUPPORTED)


def _calls(function: Callable, name: str) -> bool:
    return calls(function, name, nested=True)  # Hydra calls some of them from lambdas


def _parameters(function: Callable) -> list[str]:
    return list(inspect.signature(function).parameters)


@functools.cache
def check_single_compose() -> None:
    _require(
        _calls(hydra_utils._run_hydra, "get_mode") and _calls(hydra_utils._run_app, "run"),
        "hydra._internal.utils._run_hydra calling Hydra.get_mode, then Hydra.run",
    )
    _require(
        _parameters(_hydra_get_mode) == ["self", "config_name", "overrides"],
        "Hydra.get_mode(config_name, overrides)",
    )
    _require(
        _calls(Hydra.run, "compose_config") and _calls(Hydra.compose_config, "load_configuration"),
        "Hydra.run composing through ConfigLoaderImpl.load_configuration",
    )
    _require(
        _parameters(_load_configuration)
        == [
            "self",
            "config_name",
            "overrides",
            "run_mode",
            "from_shell",
            "validate_sweep_overrides",
        ],
        "ConfigLoaderImpl.load_configuration(config_name, overrides, run_mode, from_shell, "
        "validate_sweep_overrides)",
    )


@dataclass
class _Composed:
    """A config `get_mode` composed, and the `load_configuration` call that it answers."""

    request: tuple
    cfg: DictConfig


# The next load_configuration of each config loader: one composed config, taken once (and gone
# with its loader).
_composed: weakref.WeakKeyDictionary[ConfigLoaderImpl, _Composed] = weakref.WeakKeyDictionary()


def _request(
    config_name: str | None, overrides: list[str], run_mode: RunMode, *flags: bool
) -> tuple:
    return config_name, tuple(overrides), run_mode, *flags


def _get_mode_composing_once(self: Hydra, config_name: str | None, overrides: list[str]) -> Any:
    """`Hydra.get_mode`, composing the config the single run will use (and keeping it)."""
    loader = self.config_loader
    try:
        cfg = loader.load_configuration(config_name, overrides, run_mode=RunMode.RUN)
    except Exception:
        # A sweep (`a=1,2`), a group missing its choice: Hydra's own composition decides.
        return _hydra_get_mode(self, config_name, overrides)
    mode = cfg.hydra.mode
    if mode == RunMode.MULTIRUN:
        return mode
    run_overrides = list(overrides)
    if mode is None:
        # `_run_app` then runs with `hydra.mode=RUN` added to the overrides; the config is what
        # composing with it gives: the mode set, and the override recorded as Hydra records it.
        run_overrides.append("hydra.mode=RUN")
        cfg.hydra.mode = RunMode.RUN
        cfg.hydra.overrides.hydra.append("hydra.mode=RUN")
    _composed[loader] = _Composed(
        _request(config_name, run_overrides, RunMode.RUN, True, True), cfg
    )
    return mode


def _load_configuration_once(
    self: ConfigLoaderImpl,
    config_name: str | None,
    overrides: list[str],
    run_mode: RunMode,
    from_shell: bool = True,
    validate_sweep_overrides: bool = True,
) -> DictConfig:
    """`ConfigLoaderImpl.load_configuration`, answering the run's call with get_mode's config."""
    composed = _composed.pop(self, None)  # the next call only, whatever it asks
    request = _request(config_name, overrides, run_mode, from_shell, validate_sweep_overrides)
    if composed is not None and composed.request == request:
        return composed.cfg
    return _load_configuration(
        self, config_name, overrides, run_mode, from_shell, validate_sweep_overrides
    )


# Hydra's own, kept once even if this module is imported again after patching.
_hydra_get_mode = getattr(Hydra.get_mode, "hydra_original", Hydra.get_mode)
_load_configuration = getattr(
    ConfigLoaderImpl.load_configuration, "hydra_original", ConfigLoaderImpl.load_configuration
)
_get_mode_composing_once.hydra_original = _hydra_get_mode  # type: ignore[attr-defined]
_load_configuration_once.hydra_original = _load_configuration  # type: ignore[attr-defined]


def install_single_compose() -> None:
    """Have `python train.py` compose its config once (at import of kindling.train, before
    `@hydra.main` runs). Left out if Hydra's internals differ: `check_all` then stops the run."""
    try:
        check_single_compose()
    except HydraInternalsChanged:
        return
    Hydra.get_mode = _get_mode_composing_once
    ConfigLoaderImpl.load_configuration = _load_configuration_once


def check_all() -> None:
    """Every check above: the run stops before any work if one fails."""
    check_single_compose()
