"""Where a study lives, and what each trial leaves in it and in its run folder."""

import os
import socket
import sys
from pathlib import Path
from typing import Any

import optuna
from optuna.pruners import BasePruner
from optuna.storages import BaseStorage, JournalStorage, get_storage
from optuna.storages.journal import JournalFileBackend
from optuna.trial import FrozenTrial, TrialState

# User attributes of a trial (optuna-dashboard shows them).
SWEEPER = "sweeper"  # {"host", "pid"} of the sweeping process that runs the trial
RUN_DIR = "run_dir"
PRUNED_AT = "pruned_at_validation"  # set by kindling.callbacks.optuna_pruning.OptunaPruning
ERROR = "error"
INTERRUPTED = "interrupted"  # its sweeping process died while it ran


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


def claim(trial: optuna.Trial) -> None:
    """Mark `trial` as run by this process, so a later sweep can tell if it was cut off."""
    trial.set_user_attr(SWEEPER, {"host": socket.gethostname(), "pid": os.getpid()})


def fail_interrupted_trials(storage: BaseStorage, study: optuna.Study, retry: bool) -> list[int]:
    """Fail the running trials whose sweeping process on this machine has died; return them.

    With `retry`, the parameters of each are queued to run again as a new trial.
    """
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


def counted_trials(study: optuna.Study) -> int:
    """Trials that count toward `n_trials`: finished or running, not those cut off."""
    trials = study.get_trials(deepcopy=False)
    return sum(t.state != TrialState.WAITING and not t.user_attrs.get(INTERRUPTED) for t in trials)


def trial_summary(trial: FrozenTrial) -> dict[str, Any]:
    summary = {
        "number": trial.number,
        "state": trial.state.name,
        "value": trial.value,
        "params": trial.params,
    }
    for key in (RUN_DIR, PRUNED_AT, ERROR):
        if key in trial.user_attrs:
            summary[key] = trial.user_attrs[key]
    return summary


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
