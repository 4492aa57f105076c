"""An Optuna study run as a Hydra multirun (hydra_plugins.kindling_optuna_sweeper, docs/sweeps.md):
one job (and run folder) per trial, the search space in Hydra's sweep syntax.

The study lives in persistent storage, so a sweep that is run again continues it, and several
sweeping processes can share it. Job N of the multirun is trial N of the study: its run folder is
`<sweep dir>/<trial number>` and `${hydra:job.num}` is the trial number, which is how
kindling.callbacks.optuna_pruning.OptunaPruning finds its trial.
"""

import itertools
import logging
import os
import shlex
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import yaml
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, Transformer
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.pruners import BasePruner
from optuna.samplers import BaseSampler
from optuna.storages import BaseStorage, JournalStorage, get_storage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

from kindling.files import write_yaml
from kindling.run.job_record import TRIAL_FILE

log = logging.getLogger(__name__)

# User attributes of a trial (optuna-dashboard shows them).
SWEEPER = "sweeper"  # {"host", "pid"} of the sweeping process that runs the trial
RUN_DIR = "run_dir"
PRUNED_AT = "pruned_at_validation"  # set by OptunaPruning
ERROR = "error"
INTERRUPTED = "interrupted"  # its sweeping process died while it ran


@dataclass
class OptunaSweep:
    """What `hydra.sweeper` (configs/hydra/sweeper/optuna.yaml) configures; see there."""

    sampler: BaseSampler
    direction: str
    study_name: str
    study_dir: str
    storage: str | BaseStorage
    n_trials: int
    n_jobs: int = 1
    retry_interrupted: bool = False
    params: DictConfig | None = None

    def __post_init__(self) -> None:
        if self.storage is None:
            raise CompactHydraException(
                "hydra.sweeper.storage=null: a sweep needs a storage that its trials can open "
                "(a journal file path or an Optuna storage URL)."
            )

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def sweep(self, arguments: list[str]) -> optuna.Study:
        space = [f"{name}={value}" for name, value in (self.params or {}).items()]
        distributions, fixed = parse_search_space(space + list(arguments))
        storage = open_storage(self.storage)
        study = optuna.create_study(
            study_name=self.study_name, storage=storage, sampler=self.sampler,
            direction=self.direction, load_if_exists=True,
        )  # fmt: skip
        for number in fail_interrupted_trials(storage, study, self.retry_interrupted):
            log.warning("Trial %d was cut off when its sweep died: marked failed", number)
        if study.get_trials(deepcopy=False):
            # Continuing a study (or joining one): a seeded sampler would repeat its first draws.
            self.sampler.reseed_rng()
        log.info(
            "Study %r in %s: %d of %d trials done. Watch it: optuna-dashboard %s",
            self.study_name, self.storage, counted_trials(study), self.n_trials, self.storage,
        )  # fmt: skip

        self.space_exhausted = False
        while (to_go := self.n_trials - counted_trials(study)) > 0:
            if self.space_exhausted:
                log.info("The sampler has drawn every point of the search space: stopping.")
                break
            trials = [study.ask(distributions) for _ in range(min(self.n_jobs, to_go))]
            for trial in trials:  # so that a later sweep can tell if it was cut off
                trial.set_user_attr(SWEEPER, {"host": socket.gethostname(), "pid": os.getpid()})
            # Runs of consecutive numbers (a sweeper sharing the study may take the others).
            for _, run in itertools.groupby(enumerate(trials), lambda it: it[1].number - it[0]):
                batch = [trial for _, trial in run]
                overrides = [
                    [*fixed, *(f"{name}={value}" for name, value in trial.params.items())]
                    for trial in batch
                ]
                # Job number = trial number: the run folder and ${hydra:job.num} name the trial.
                returns = self.launcher.launch(overrides, initial_job_idx=batch[0].number)
                for trial, job in zip(batch, returns, strict=True):
                    self._record(study, trial, job)

        self._report_best(study, fixed)
        return study

    def _record(self, study: optuna.Study, trial: optuna.Trial, job: JobReturn) -> None:
        """Tell the study how the trial's job ended, and write it into the run folder."""
        run_dir = job.hydra_cfg.hydra.runtime.output_dir
        trial.set_user_attr(RUN_DIR, run_dir)
        metric = self.config.get("optimized_metric")
        # The run's own attributes: OptunaPruning, in this or another process, marks pruning.
        pruned_at = study.get_trials(deepcopy=False)[trial.number].user_attrs.get(PRUNED_AT)
        error = None
        if pruned_at is not None:
            self._tell(study, trial, TrialState.PRUNED)
            log.info("Trial %d pruned at validation %s", trial.number, pruned_at)
        elif job.status == JobStatus.FAILED:
            error = f"{type(job._return_value).__name__}: {job._return_value}"
        else:
            try:
                value = float(job.return_value)
            except (TypeError, ValueError):
                error = f"the run returned {job.return_value!r}, not a value of {metric}"
            else:  # state=None: Optuna records a NaN as failed, anything else as complete
                self._tell(study, trial, None, value)
                log.info("Trial %d: %s=%s", trial.number, metric, value)
        if error is not None:
            trial.set_user_attr(ERROR, error)
            self._tell(study, trial, TrialState.FAIL)
            log.warning("Trial %d failed: %s", trial.number, error)
        frozen = study.get_trials(deepcopy=False)[trial.number]
        write_yaml(Path(run_dir) / TRIAL_FILE, trial_summary(frozen))

    def _tell(
        self, study: optuna.Study, trial: optuna.Trial, state: TrialState | None, value=None
    ) -> None:
        try:
            study.tell(trial, value, state=state)
        except RuntimeError as error:
            # Samplers that draw each point once (grid, brute force) stop the study at the end
            # of the space; outside Study.optimize that is an error, raised once the trial is told.
            if "Study.stop" not in str(error):
                raise
            self.space_exhausted = True

    def _report_best(self, study: optuna.Study, fixed: list[str]) -> None:
        """Print the best trial and write it to best_trial.yaml (sweep and study folders)."""
        if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            log.warning("No trial of study %r has completed: no best trial.", study.study_name)
            return
        best = trial_summary(study.best_trial)
        best["train_command"] = retrain_command(best, fixed)
        best["study_name"] = study.study_name
        best["storage"] = str(self.storage)
        for folder in (Path(self.config.hydra.sweep.dir), Path(self.study_dir)):
            write_yaml(folder / "best_trial.yaml", best)
        log.info(
            "Best trial %d: %s=%s, run folder %s\nRetrain it: %s",
            best["number"], self.config.get("optimized_metric"), best["value"],
            best.get(RUN_DIR), best["train_command"],
        )  # fmt: skip


def parse_search_space(overrides: list[str]) -> tuple[dict[str, BaseDistribution], list[str]]:
    """Split overrides into the distributions to sample and the overrides every trial gets."""
    distributions: dict[str, BaseDistribution] = {}
    fixed: list[str] = []
    for override in OverridesParser.create().parse_overrides(overrides):
        if override.is_sweep_override():
            distributions[override.get_key_element()] = to_distribution(override)
        else:
            fixed.append(override.input_line)
    return distributions, fixed


def to_distribution(override: Override) -> BaseDistribution:
    value = override.value()
    if override.is_choice_sweep() or (override.is_range_sweep() and value.shuffle):
        # Lists and strings become override strings, e.g. "[16,32]", that Hydra reads back.
        return CategoricalDistribution(list(override.sweep_iterator(Transformer.encode)))
    if override.is_range_sweep():
        numbers = list(override.sweep_iterator())
        if not numbers:
            raise CompactHydraException(f"{override.input_line}: the range is empty.")
        if all(isinstance(x, int) for x in numbers):
            return IntDistribution(numbers[0], numbers[-1], step=int(value.step))
        return CategoricalDistribution(numbers)
    if override.is_interval_sweep():
        log_scale = "log" in value.tags
        if isinstance(value.start, int) and isinstance(value.end, int):
            return IntDistribution(value.start, value.end, log=log_scale)
        return FloatDistribution(float(value.start), float(value.end), log=log_scale)
    raise CompactHydraException(f"{override.input_line}: the Optuna sweeper cannot sample it.")


def open_storage(storage: str | BaseStorage) -> BaseStorage:
    """An Optuna storage URL (`sqlite:///...`) or object; any other string is a journal file."""
    if isinstance(storage, str) and "://" not in storage:
        Path(storage).parent.mkdir(parents=True, exist_ok=True)
        storage = JournalStorage(JournalFileBackend(storage))
    return get_storage(storage)


def load_trial(
    storage: str | BaseStorage, study_name: str, number: int, pruner: BasePruner
) -> optuna.Trial:
    """Trial `number` of a study, for a run in another process than the one that asked for it."""
    storage = open_storage(storage)
    study = optuna.load_study(study_name=study_name, storage=storage, pruner=pruner)
    return optuna.Trial(study, _trial_id(storage, study_name, number))


def _trial_id(storage: BaseStorage, study_name: str, number: int) -> int:
    study_id = storage.get_study_id_from_name(study_name)
    return storage.get_trial_id_from_study_id_trial_number(study_id, number)


def fail_interrupted_trials(storage: BaseStorage, study: optuna.Study, retry: bool) -> list[int]:
    """Fail the running trials whose sweeping process on this machine has died; return them.
    With `retry`, the parameters of each are queued to run again as a new trial."""
    interrupted = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        owner = trial.user_attrs.get(SWEEPER)
        if owner is None or owner["host"] != socket.gethostname() or _alive(owner["pid"]):
            continue
        trial_id = _trial_id(storage, study.study_name, trial.number)
        storage.set_trial_user_attr(trial_id, INTERRUPTED, True)
        storage.set_trial_user_attr(trial_id, ERROR, f"its sweeping process ({owner['pid']}) died")
        study.tell(trial.number, state=TrialState.FAIL, skip_if_finished=True)
        if retry:
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
        interrupted.append(trial.number)
    return interrupted


def _alive(pid: int) -> bool:
    if sys.platform == "win32":  # os.kill(pid, 0) would stop the process there
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def counted_trials(study: optuna.Study) -> int:
    """Trials that count toward `n_trials`: finished or running, not those cut off."""
    trials = study.get_trials(deepcopy=False)
    return sum(t.state != TrialState.WAITING and not t.user_attrs.get(INTERRUPTED) for t in trials)


def retrain_command(best: dict[str, Any], fixed: list[str]) -> str:
    """`python train.py` with the overrides the best trial ran with (its run folder's: a study
    continued by another command keeps its trials' own), without the search and the launcher (a
    single run has neither: Hydra refuses their keys). Where its folder is gone: this sweep's
    own overrides and the trial's parameters."""
    params = [f"{name}={value}" for name, value in best["params"].items()]
    ran_with = Path(best.get(RUN_DIR) or "", ".hydra", "overrides.yaml")
    try:
        overrides = yaml.safe_load(ran_with.read_text()) if best.get(RUN_DIR) else None
    except (OSError, yaml.YAMLError):
        overrides = None
    if not isinstance(overrides, list):
        overrides = [*fixed, *params]
    search = ("hparams_search", "hydra/sweeper", "hydra.sweeper.", "hydra/launcher",
              "hydra.launcher.")  # fmt: skip
    kept = [o for o in overrides if not o.lstrip("+~").startswith(search)]
    return shlex.join(["python", "train.py", *kept])


def trial_summary(trial: FrozenTrial) -> dict[str, Any]:
    attributes = {k: v for k, v in trial.user_attrs.items() if k in (RUN_DIR, PRUNED_AT, ERROR)}
    return {
        "number": trial.number,
        "state": trial.state.name,
        "value": trial.value,
        "params": trial.params,
        **attributes,
    }
