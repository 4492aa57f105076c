"""The private parts of Hydra that kindling patches: a single run composes its config once."""

import functools
import sys
from collections.abc import Iterator

import hydra
import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_automatic_config_search_path
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from kindling.utils import hydra_patches

from conftest import CONFIG_DIR, ROOT


@pytest.fixture
def composed(monkeypatch) -> list[tuple[list[str], RunMode]]:
    """The compositions Hydra itself runs: (overrides, run mode) of each."""
    composed = []
    original = hydra_patches._load_configuration

    @functools.wraps(original)
    def counted(self, config_name, overrides, run_mode, *args, **kwargs):
        composed.append((list(overrides), run_mode))
        return original(self, config_name, overrides, run_mode, *args, **kwargs)

    monkeypatch.setattr(hydra_patches, "_load_configuration", counted)
    return composed


@pytest.fixture
def hydra_app(composed) -> Iterator[tuple[Hydra, list]]:
    """Hydra set up as `python train.py` sets it up, and the compositions Hydra itself ran."""
    GlobalHydra.instance().clear()
    search_path = create_automatic_config_search_path(str(ROOT / "train.py"), None, "configs")
    yield Hydra.create_main_hydra2(task_name="train", config_search_path=search_path), composed
    GlobalHydra.instance().clear()


def run_compose(app: Hydra, overrides: list[str]) -> tuple[RunMode | None, DictConfig]:
    """The mode `_run_hydra` reads, then the config `Hydra.run` composes with that mode."""
    mode = app.get_mode("train", overrides)
    run_overrides = [*overrides, "hydra.mode=RUN"] if mode is None else overrides
    return mode, app.compose_config("train", run_overrides, run_mode=RunMode.RUN)


def test_patches_are_installed_when_kindling_train_is_imported() -> None:
    hydra_patches.check_all()  # the installed Hydra has what they need
    assert Hydra.get_mode is hydra_patches._get_mode_composing_once
    assert ConfigLoaderImpl.load_configuration is hydra_patches._load_configuration_once


def test_python_train_py_composes_its_config_once(composed, tmp_path, monkeypatch) -> None:
    """`@hydra.main` as train.py has it, run in-process with a task that only reads the mode."""
    no_logging = ["hydra/job_logging=none", "hydra/hydra_logging=none"]
    monkeypatch.setattr(sys, "argv", ["train.py", f"paths.log_dir={tmp_path}", *no_logging])
    modes = []

    def task(cfg: DictConfig) -> None:
        modes.append(HydraConfig.get().mode)

    hydra.main(version_base="1.3", config_path=str(CONFIG_DIR), config_name="train")(task)()
    assert modes == [RunMode.RUN]
    assert len(composed) == 1


def test_a_single_run_composes_once_the_config_hydra_would(hydra_app) -> None:
    app, composed = hydra_app
    overrides = ["model=lstm", "trainer.max_epochs=3"]
    mode, cfg = run_compose(app, overrides)
    assert mode is None  # nothing sets hydra.mode: _run_hydra runs once, with hydra.mode=RUN
    assert composed == [(overrides, RunMode.RUN)]
    # Exactly what Hydra's own second composition gives, `hydra.mode=RUN` override included.
    again = hydra_patches._load_configuration(
        app.config_loader, "train", [*overrides, "hydra.mode=RUN"], RunMode.RUN
    )
    assert OmegaConf.to_container(cfg) == OmegaConf.to_container(again)
    assert cfg.hydra.mode == RunMode.RUN and list(cfg.hydra.overrides.hydra) == ["hydra.mode=RUN"]


def test_a_config_that_sweeps_is_composed_for_the_sweep(hydra_app) -> None:
    app, composed = hydra_app
    overrides = ["hparams_search=optuna"]  # sets hydra.mode: MULTIRUN
    assert app.get_mode("train", overrides) == RunMode.MULTIRUN
    cfg = app.compose_config("train", [*overrides], run_mode=RunMode.MULTIRUN)
    assert cfg.hydra.sweeper.n_trials == 20
    assert [run_mode for _, run_mode in composed] == [RunMode.RUN, RunMode.MULTIRUN]


def test_a_config_composed_for_another_call_is_not_reused(hydra_app) -> None:
    app, composed = hydra_app
    assert app.get_mode("train", ["model=lstm"]) is None
    # `-m`: Hydra composes for the sweep; then no later call gets the kept config.
    app.compose_config("train", ["model=lstm", "hydra.mode=MULTIRUN"], RunMode.MULTIRUN)
    app.compose_config("train", ["model=lstm", "hydra.mode=RUN"], RunMode.RUN)
    assert len(composed) == 3


def test_sweep_values_without_m_keep_hydras_answer(hydra_app) -> None:
    """`data.batch_size=32,64` cannot compose for a run; Hydra's own get_mode answers (None:
    the run then stops with Hydra's advice to add --multirun)."""
    app, composed = hydra_app
    assert app.get_mode("train", ["data.batch_size=32,64"]) is None
    # The run's composition stops at the overrides, before reading any config.
    assert [run_mode for _, run_mode in composed] == [RunMode.RUN, RunMode.MULTIRUN]
    assert app.get_mode("train", ["hparams_search=optuna", "data.batch_size=32,64"]) == (
        RunMode.MULTIRUN
    )


def test_changed_hydra_internals_stop_the_run_with_one_line(monkeypatch) -> None:
    monkeypatch.setattr(hydra_patches, "_hydra_get_mode", lambda self, config_name: None)
    hydra_patches.check_single_compose.cache_clear()
    try:
        with pytest.raises(hydra_patches.HydraInternalsChanged, match=r"Hydra\.get_mode") as error:
            hydra_patches.check_all()
    finally:
        hydra_patches.check_single_compose.cache_clear()
    assert "pip install 'hydra-core>=1.3.8,<1.4'" in str(error.value)


def test_pyproject_bounds_hydra_to_the_checked_versions() -> None:
    assert f'"{hydra_patches.SUPPORTED}"' in (ROOT / "pyproject.toml").read_text()
