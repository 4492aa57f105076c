"""Optuna sweeps: search space, pruning, failed trials, resumed and shared studies, best trial."""

import os
import shlex
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import lightning as L
import optuna
import pytest
import torch
import yaml
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution
from optuna.trial import TrialState
from torch.utils.data import DataLoader

from hydra_plugins.kindling_optuna_sweeper.optuna_sweeper import OptunaSweeper
from kindling.callbacks.optuna_pruning import OptunaPruning
from kindling.optuna_sweep import (
    counted_trials,
    fail_interrupted_trials,
    open_storage,
    parse_search_space,
    retrain_command,
)
from kindling.train import run

from forked import Forked
from helpers import start_train_py, train_py

# A trial of a second or two: one epoch of two batches, no test, nothing logged.
TINY = [
    "trainer=cpu", "debug=limit", "trainer.max_epochs=1", "trainer.limit_train_batches=2",
    "trainer.limit_val_batches=1", "test=false", "logger=none", "callbacks=none",
]  # fmt: skip
# hparams_search/pruner=always: prunes at the first validation, as accuracy is never above 1.1.
ALWAYS_PRUNE = """
# @package callbacks.optuna_pruning.pruner
_target_: optuna.pruners.ThresholdPruner
lower: 1.1
"""


def test_search_space_from_hydra_sweep_syntax() -> None:
    distributions, fixed = parse_search_space(
        [
            "lr=tag(log, interval(1e-4, 1e-1))",
            "dropout=interval(0, 0.5)",
            "layers=range(1, 7, 2)",
            "channels=choice([16, 32], [32, 64])",
            "trainer.max_epochs=5",
        ]
    )
    assert distributions == {
        "lr": FloatDistribution(1e-4, 1e-1, log=True),
        "dropout": FloatDistribution(0.0, 0.5),
        "layers": IntDistribution(1, 5, step=2),  # as Python's range: 7 is excluded
        "channels": CategoricalDistribution(["[16,32]", "[32,64]"]),
    }
    assert fixed == ["trainer.max_epochs=5"]
    # Each sampled value, written back as an override, means the same to Hydra.
    (override,) = OverridesParser.create().parse_overrides(["channels=[16,32]"])
    assert override.value() == [16, 32]


def test_hydra_finds_the_sweeper_and_the_search_composes(compose_config) -> None:
    found = {f"{s.__module__}.{s.__name__}" for s in Plugins.instance().discover(Sweeper)}
    assert f"{OptunaSweeper.__module__}.OptunaSweeper" in found
    cfg = compose_config("hparams_search=optuna", "hparams_search/pruner=hyperband")
    assert cfg.callbacks.optuna_pruning.pruner._target_ == "optuna.pruners.HyperbandPruner"
    sweeper = HydraConfig.get().sweeper
    assert sweeper._target_.endswith("kindling_optuna_sweeper.optuna_sweeper.OptunaSweeper")
    assert sweeper.sampler._target_ == "optuna.samplers.TPESampler"
    assert sweeper.storage == f"{sweeper.study_dir}/journal.log"


class ScriptedAccuracy(L.LightningModule):
    """Logs `val/acc` from a list, one value per epoch."""

    def __init__(self, accuracies: list[float]) -> None:
        super().__init__()
        self.accuracies = accuracies
        self.layer = torch.nn.Linear(1, 1)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.layer(batch).sum()

    def validation_step(self, batch: torch.Tensor, batch_idx: int) -> None:
        self.log("val/acc", self.accuracies[self.current_epoch])

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def fit_trial(tmp_path: Path, accuracies: list[float]) -> tuple[OptunaPruning, L.Trainer]:
    """Trial 1 of a study whose trial 0 reported 0.9 at every validation, fit with pruning."""
    storage = str(tmp_path / "journal.log")
    study = optuna.create_study(study_name="s", storage=open_storage(storage), direction="maximize")
    first = study.ask()
    for step in range(len(accuracies)):
        first.report(0.9, step)
    study.tell(first, 0.9)
    trial = study.ask()
    pruner = optuna.pruners.MedianPruner(n_startup_trials=1, n_warmup_steps=1)
    pruning = OptunaPruning("val/acc", pruner, storage, "s", trial.number)
    trainer = L.Trainer(
        max_epochs=len(accuracies), callbacks=[pruning], logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
    )  # fmt: skip
    data = DataLoader(torch.zeros(2, 1), batch_size=1)
    trainer.fit(ScriptedAccuracy(accuracies), train_dataloaders=data, val_dataloaders=data)
    return pruning, trainer


def test_pruning_stops_a_losing_trial_after_its_warmup(tmp_path: Path) -> None:
    pruning, trainer = fit_trial(tmp_path, accuracies=[0.1] * 5)
    study = optuna.load_study(study_name="s", storage=open_storage(str(tmp_path / "journal.log")))
    frozen = study.trials[1]
    # Reported after each validation; below the median at validation 1, the first after warmup.
    assert frozen.intermediate_values == pytest.approx({0: 0.1, 1: 0.1})
    assert frozen.user_attrs["pruned_at_validation"] == 1
    assert pruning.pruned and trainer.current_epoch == 2
    assert trainer.limit_test_batches == 0  # a pruned run skips its test


def test_pruning_lets_a_winning_trial_train_to_the_end(tmp_path: Path) -> None:
    pruning, trainer = fit_trial(tmp_path, accuracies=[0.95] * 4)
    study = optuna.load_study(study_name="s", storage=open_storage(str(tmp_path / "journal.log")))
    assert study.trials[1].intermediate_values == pytest.approx(dict.fromkeys(range(4), 0.95))
    assert not pruning.pruned and trainer.current_epoch == 4


def test_trials_of_a_dead_sweeper_are_failed_and_can_run_again(tmp_path: Path) -> None:
    storage = open_storage(str(tmp_path / "journal.log"))
    study = optuna.create_study(study_name="s", storage=storage)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for pid in (dead.pid, os.getpid()):
        trial = study.ask({"lr": FloatDistribution(1e-4, 1e-1)})  # as the sweeper asks
        trial.set_user_attr("sweeper", {"host": socket.gethostname(), "pid": pid})

    assert fail_interrupted_trials(storage, study, retry=True) == [0]
    cut_off, alive, retry = study.get_trials()
    assert cut_off.state == TrialState.FAIL and cut_off.user_attrs["interrupted"]
    assert alive.state == TrialState.RUNNING  # its sweeper is still at work
    assert retry.state == TrialState.WAITING and retry.user_attrs["retry_of"] == 0
    # Neither the cut-off trial nor the queued one counts toward n_trials; the running one does.
    assert counted_trials(study) == 1
    space = {"lr": FloatDistribution(1e-4, 1e-1)}
    assert study.ask(space).params == cut_off.params  # the retry runs next


def write_search(tmp_path: Path, config: str) -> list[str]:
    """Put configs/hparams_search/under_test.yaml in tmp_path; the overrides that pick it."""
    (tmp_path / "configs" / "hparams_search" / "pruner").mkdir(parents=True)
    (tmp_path / "configs" / "hparams_search" / "under_test.yaml").write_text(config)
    (tmp_path / "configs" / "hparams_search" / "pruner" / "always.yaml").write_text(ALWAYS_PRUNE)
    return ["-m", "hparams_search=under_test", f"hydra.searchpath=[file://{tmp_path / 'configs'}]"]


def search(tmp_path: Path, config: str, *overrides: str) -> str:
    joblib = "hydra/launcher=joblib" in overrides  # its pool of workers needs a new interpreter
    result = train_py(
        *write_search(tmp_path, config), *overrides, cwd=tmp_path, new_interpreter=joblib
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, output[-4000:]
    return output


def load_study(tmp_path: Path) -> optuna.Study:
    journal = tmp_path / "logs" / "debug" / "sweeps" / "under_test" / "journal.log"
    return optuna.load_study(study_name="under_test", storage=open_storage(str(journal)))


def trial_folders(tmp_path: Path) -> list[Path]:
    return sorted(
        (p for p in (tmp_path / "logs" / "debug" / "multiruns").glob("*/*") if p.is_dir()),
        key=lambda p: int(p.name),
    )


SEARCH = """
# @package _global_
defaults:
  - optuna
  - override /hparams_search/pruner: nop
hydra:
  sweeper:
    n_trials: {n_trials}
    sampler:
      seed: {seed}
      n_startup_trials: 10
    params:
      model.optimizer.lr: tag(log, interval(0.001, 0.01))
      model.net.channels: choice([8, 16], [16, 32])
"""


@pytest.mark.slow
def test_failed_trials_do_not_end_the_sweep_and_the_best_is_written(
    tmp_path: Path, compose_config
) -> None:
    config = """
# @package _global_
defaults:
  - optuna
  - override /hparams_search/sampler: brute_force  # each of the four settings once
  - override /hparams_search/pruner: nop
hydra:
  sweeper:
    n_trials: 4
    params:
      data.batch_size: choice(0, 64)
      model.optimizer.lr: choice(0.003, 1e12)
      model.net.channels: "[8, 16]"
"""
    # Two settings crash, one diverges (in four steps), one trains.
    quick = [*TINY[:-1], "trainer.limit_train_batches=4", "callbacks=[stop_on_divergence]"]
    output = search(
        tmp_path, config, *quick, "hparams_search/pruner=nop", "hydra.sweeper.n_trials=4"
    )
    study = load_study(tmp_path)
    states = sorted(t.state.name for t in study.trials)
    assert states == ["COMPLETE", "FAIL", "FAIL", "FAIL"]
    errors = " ".join(t.user_attrs.get("error", "") for t in study.trials)
    assert errors.count("data.batch_size must be a positive integer, got 0") == 2
    assert errors.count("The training loss was NaN or inf") == 1
    # Each trial's folder, named by its number, says how it ended.
    for trial, folder in zip(study.trials, trial_folders(tmp_path), strict=True):
        assert folder.name == str(trial.number)
        assert yaml.safe_load((folder / "trial.yaml").read_text())["state"] == trial.state.name
    # The best trial, in the multirun folder and in the study's own.
    (sweep_dir,) = (tmp_path / "logs" / "debug" / "multiruns").iterdir()
    best = yaml.safe_load((sweep_dir / "best_trial.yaml").read_text())
    assert best == yaml.safe_load(
        (tmp_path / "logs/debug/sweeps/under_test/best_trial.yaml").read_text()
    )
    assert best["params"] == {"data.batch_size": 64, "model.optimizer.lr": 0.003}
    assert best["value"] == study.best_value and 0.0 < best["value"] <= 1.0
    assert best["run_dir"] == str(sweep_dir / str(study.best_trial.number))
    assert {"data.batch_size=64", "model.optimizer.lr=0.003"} < set(best["train_command"].split())
    assert "hparams_search" not in best["train_command"]
    assert f"Best trial {study.best_trial.number}" in output
    # The printed command retrains the best trial as it stands, a single run (composed in this
    # process from the command's overrides, as train.py composes its command line).
    assert f"Retrain it: {best['train_command']}" in output
    python, script, *overrides = shlex.split(best["train_command"])
    assert (python, script) == ("python", "train.py")
    assert 0.0 < run(compose_config(*overrides)) <= 1.0


@pytest.mark.slow
def test_pruned_trials_in_launcher_workers_are_recorded_and_the_sweep_goes_on(
    tmp_path: Path,
) -> None:
    config = SEARCH.format(n_trials=2, seed=0)
    # Two trials at a time, each in a joblib worker process: the trial is opened there again.
    parallel = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2", "hydra.sweeper.n_jobs=2"]
    output = search(
        tmp_path, config, *TINY, *parallel, "trainer.max_epochs=3",
        "hparams_search/pruner=always",
    )  # fmt: skip
    study = load_study(tmp_path)
    assert [t.state for t in study.trials] == [TrialState.PRUNED] * 2
    for trial, folder in zip(study.trials, trial_folders(tmp_path), strict=True):
        # Reported once, pruned at the first validation of three.
        assert list(trial.intermediate_values) == [0]
        assert yaml.safe_load((folder / "trial.yaml").read_text())["pruned_at_validation"] == 0
    assert "no best trial" in output


def sweep_args(tmp_path: Path, config: str, *overrides: str) -> list[str]:
    return [*write_search(tmp_path, config), *overrides]


def wait_for(condition: Callable[[], bool], process: Forked, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert process.poll() is None, "the sweep ended before the condition was met"
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def running_trial(tmp_path: Path, number: int) -> bool:
    """Whether trial `number` has been started and claimed by a sweeping process."""
    if not (tmp_path / "logs" / "debug" / "sweeps" / "under_test" / "journal.log").exists():
        return False
    try:
        trials = load_study(tmp_path).trials
    except KeyError:  # the study is not created yet
        return False
    return len(trials) > number and "sweeper" in trials[number].user_attrs


@pytest.mark.slow
def test_a_killed_sweep_continues_its_study_when_run_again(tmp_path: Path) -> None:
    args = sweep_args(tmp_path, SEARCH.format(n_trials=4, seed=0), *TINY)
    first = start_train_py(*args, cwd=tmp_path)
    try:
        wait_for(lambda: running_trial(tmp_path, 2), first)
    finally:
        first.kill()  # during trial 2, after two finished trials
        first.wait()
    done = {t.number: t.params for t in load_study(tmp_path).trials if t.state.is_finished()}
    assert sorted(done) == [0, 1]

    result = train_py(*args, cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    trials = load_study(tmp_path).trials
    # The first two are kept, trial 2 is failed as cut off, and two more make four.
    assert {n: trials[n].params for n in (0, 1)} == done
    assert trials[2].state == TrialState.FAIL and trials[2].user_attrs["interrupted"]
    assert [t.state for t in trials[3:]] == [TrialState.COMPLETE] * 2
    # The seeded sampler does not start its draws over: new learning rates, not trial 0's again.
    first_lrs = {params["model.optimizer.lr"] for params in done.values()}
    assert not first_lrs & {t.params["model.optimizer.lr"] for t in trials[3:]}
    second_sweep = max((tmp_path / "logs" / "debug" / "multiruns").iterdir())
    assert sorted(p.name for p in second_sweep.iterdir() if p.is_dir()) == ["3", "4"]


@pytest.mark.slow
def test_two_sweepers_on_one_storage_run_different_trials(tmp_path: Path) -> None:
    args = sweep_args(tmp_path, SEARCH.format(n_trials=4, seed=0), *TINY)
    sweepers = [
        start_train_py(*args, f"hydra.sweeper.sampler.seed={seed}", cwd=tmp_path) for seed in (1, 2)
    ]
    for sweeper in sweepers:
        assert sweeper.wait(timeout=600) == 0, sweeper.stdout.read()[-4000:]
    trials = load_study(tmp_path).trials
    # Each counts the other's trials: four in all (five if both asked for the last at once).
    assert len(trials) in (4, 5) and all(t.state == TrialState.COMPLETE for t in trials)
    # One folder per trial, named by its number, wherever its sweeper put its multirun folder.
    folders = trial_folders(tmp_path)
    assert [f.name for f in folders] == [str(t.number) for t in trials]
    assert [t.user_attrs["run_dir"] for t in trials] == [str(f) for f in folders]


@pytest.mark.slow
def test_a_ddp_trial_is_pruned_on_every_rank(tmp_path: Path) -> None:
    two_ranks = [o for o in TINY if o != "trainer=cpu"] + ["trainer=ddp_cpu"]
    output = search(
        tmp_path, SEARCH.format(n_trials=1, seed=0), *two_ranks, "trainer.max_epochs=3",
        "hparams_search/pruner=always",
    )  # fmt: skip
    (trial,) = load_study(tmp_path).trials
    assert trial.state == TrialState.PRUNED and list(trial.intermediate_values) == [0]
    # Rank 1 stopped with rank 0: it did not train on into a step whose all-reduce rank 0 had
    # left (gloo's "Connection closed by peer"; NCCL would hang). It ran no sweep of its own.
    assert "Traceback" not in output and "RuntimeError" not in output, output[-4000:]
    assert output.count("Launching 1 jobs locally") == 1


def test_the_retrain_line_is_the_best_trials_own_command(tmp_path: Path) -> None:
    """A study continued by a command with other fixed overrides (trainer.max_epochs=3 now, 2
    when the best trial ran) retrains the trial as it ran; without its folder, as this sweep
    would run it."""
    run_dir = tmp_path / "4"
    (run_dir / ".hydra").mkdir(parents=True)
    ran_with = ["hparams_search=optuna", "trainer.max_epochs=2", "model.optimizer.lr=0.01"]
    (run_dir / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(ran_with))
    best = {"params": {"model.optimizer.lr": 0.01}, "run_dir": str(run_dir)}
    now = ["hparams_search=optuna", "trainer.max_epochs=3"]
    expected = "python train.py trainer.max_epochs=2 model.optimizer.lr=0.01"
    assert retrain_command(best, now) == expected
    gone = {**best, "run_dir": str(tmp_path / "moved")}
    assert retrain_command(gone, now) == expected.replace("epochs=2", "epochs=3")
