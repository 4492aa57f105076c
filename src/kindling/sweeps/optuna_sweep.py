"""An Optuna study run as a Hydra multirun: one job (and run folder) per trial.

The study lives in persistent storage, so a sweep that is run again continues it, and several
sweeping processes can share it. Job N of the multirun is trial N of the study: its run folder is
`<sweep dir>/<trial number>` and `${hydra:job.num}` is the trial number, which is how
kindling.callbacks.optuna_pruning.OptunaPruning finds its trial.
"""

import logging
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import optuna
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig
from optuna.samplers import BaseSampler
from optuna.storages import BaseStorage
from optuna.trial import TrialState

from kindling.config.errors import UserError
from kindling.run.job_record import TRIAL_FILE, write_yaml
from kindling.sweeps import study as studies
from kindling.sweeps.search_space import parse_search_space

log = logging.getLogger(__name__)


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
            raise UserError(
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
        storage = studies.open_storage(self.storage)
        study = optuna.create_study(
            study_name=self.study_name, storage=storage, sampler=self.sampler,
            direction=self.direction, load_if_exists=True,
        )  # fmt: skip
        for number in studies.fail_interrupted_trials(storage, study, self.retry_interrupted):
            log.warning("Trial %d was cut off when its sweep died: marked failed", number)
        if study.get_trials(deepcopy=False):
            # Continuing a study (or joining one): a seeded sampler would repeat its first draws.
            self.sampler.reseed_rng()
        log.info(
            "Study %r in %s: %d of %d trials done. Watch it: optuna-dashboard %s",
            self.study_name, self.storage, studies.counted_trials(study), self.n_trials,
            self.storage,
        )  # fmt: skip

        self.space_exhausted = False
        while (to_go := self.n_trials - studies.counted_trials(study)) > 0:
            if self.space_exhausted:
                log.info("The sampler has drawn every point of the search space: stopping.")
                break
            trials = [study.ask(distributions) for _ in range(min(self.n_jobs, to_go))]
            for trial in trials:
                studies.claim(trial)
            for batch in _consecutive(trials):
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
        run_dir = job.hydra_cfg.hydra.runtime.output_dir if job.hydra_cfg else None
        if run_dir is not None:
            trial.set_user_attr(studies.RUN_DIR, run_dir)
        metric = self.config.get("optimized_metric")
        # The run's own attributes: OptunaPruning, in this or another process, marks pruning.
        pruned_at = study.get_trials(deepcopy=False)[trial.number].user_attrs.get(studies.PRUNED_AT)
        if job.status == JobStatus.FAILED and isinstance(job._return_value, optuna.TrialPruned):
            pruned_at = str(job._return_value)
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
            trial.set_user_attr(studies.ERROR, error)
            self._tell(study, trial, TrialState.FAIL)
            log.warning("Trial %d failed: %s", trial.number, error)
        if run_dir is not None:
            frozen = study.get_trials(deepcopy=False)[trial.number]
            write_yaml(Path(run_dir) / TRIAL_FILE, studies.trial_summary(frozen))

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

    def _report_best(self, study: optuna.Study, fixed: Sequence[str]) -> None:
        """Print the best trial and write it to best_trial.yaml (sweep and study folders)."""
        if not study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            log.warning("No trial of study %r has completed: no best trial.", study.study_name)
            return
        best = studies.trial_summary(study.best_trial)
        # Retrain it: the sweep's own overrides, without the search and the launcher (a single
        # run has neither: Hydra refuses their keys), and the best parameters.
        search = ("hparams_search", "hydra/sweeper", "hydra.sweeper.", "hydra/launcher",
                  "hydra.launcher.")  # fmt: skip
        kept = [o for o in fixed if not o.lstrip("+~").startswith(search)]
        params = [f"{name}={value}" for name, value in best["params"].items()]
        best["train_command"] = shlex.join(["python", "train.py", *kept, *params])
        best["study_name"] = study.study_name
        best["storage"] = str(self.storage)
        for folder in (Path(self.config.hydra.sweep.dir), Path(self.study_dir)):
            write_yaml(folder / "best_trial.yaml", best)
        log.info(
            "Best trial %d: %s=%s, run folder %s\nRetrain it: %s",
            best["number"], self.config.get("optimized_metric"), best["value"],
            best.get(studies.RUN_DIR), best["train_command"],
        )  # fmt: skip


def _consecutive(trials: list[optuna.Trial]) -> list[list[optuna.Trial]]:
    """Split trials into runs of consecutive numbers (a parallel sweeper may take the others)."""
    batches: list[list[optuna.Trial]] = []
    for trial in trials:
        if batches and trial.number == batches[-1][-1].number + 1:
            batches[-1].append(trial)
        else:
            batches.append([trial])
    return batches
