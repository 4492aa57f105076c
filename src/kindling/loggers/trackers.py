"""Trackers (MLflow, W&B, TensorBoard, any Lightning Logger) record a run; they do not carry it:
one that fails before training stops the run in one line naming it; one that fails during the
run is warned about in one line and left out, while training and the CSV history go on. Loaded
by runs that have one (the CSV logger alone is the run's own record)."""

import functools
import logging
from collections.abc import Callable
from typing import Any

from lightning.pytorch.loggers import CSVLogger, Logger, MLFlowLogger
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import DictConfig

from kindling.errors import UserError
from kindling.run.provenance import NO_GIT

log = logging.getLogger(__name__)

# The Logger methods through which Lightning and kindling write to a tracker.
WRITES = "log_hyperparams", "log_metrics", "log_graph", "save", "finalize", "after_save_checkpoint"


def start(
    loggers: DictConfig | None, built: list[Logger], hparams: dict[str, Any], provenance: dict
) -> None:
    """Log `hparams` to each logger (a failure stops the run in one line naming its config key),
    tag MLflow runs with the `provenance`, then let each tracker fail alone."""
    keys = [f"logger.{name}" for name, entry in (loggers or {}).items() if entry is not None]
    if len(keys) != len(built):  # fast_dev_run: Lightning holds one DummyLogger instead
        keys = ["logger"] * len(built)
    for key, logger in zip(keys, built, strict=True):
        try:  # Lightning calls loggers on rank 0 only
            logger.log_hyperparams(hparams)
            if isinstance(logger, MLFlowLogger):
                tag(logger, provenance)
        except UserError:
            raise
        except Exception as error:
            raise UserError(
                f"{key} failed before training: {first_line(error).rstrip('.')}. Fix its "
                f"settings under {key}, or train without it: {key}=null."
            ) from error
        tolerate_failures(logger)


@rank_zero_only
def tag(logger: MLFlowLogger, record: dict[str, Any]) -> None:
    """Tag the MLflow run with the commit (`mlflow.source.git.commit`), command and versions."""
    tags = {"command": record["command"], "git.dirty": str(record["git"]["dirty"])}
    tags |= {f"version.{name}": str(value) for name, value in record["versions"].items()}
    if record["git"]["commit"] != NO_GIT:
        tags["mlflow.source.git.commit"] = record["git"]["commit"]
    for key, value in tags.items():
        logger.experiment.set_tag(logger.run_id, key, value)


def tolerate_failures(logger: Logger) -> None:
    """The first failure of one of `logger`'s writes is warned about in one line; the logger
    then does nothing more. What any library logs during a write is held back, and let through
    unless the write failed (the tracker's own lines about a failure are a traceback or two)."""
    if isinstance(logger, CSVLogger):
        return
    failed: list[Exception] = []

    def guarded(write: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(write)
        def write_unless_failed(*args: Any, **kwargs: Any) -> Any:
            if failed:
                return None
            loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
            handlers = {h for lg in loggers if isinstance(lg, logging.Logger) for h in lg.handlers}
            held: list[logging.LogRecord] = []
            for handler in handlers:
                handler.addFilter(held.append)  # a filter: None drops the record
            try:
                result = write(*args, **kwargs)
            except Exception as error:
                failed.append(error)
            finally:
                for handler in handlers:
                    handler.removeFilter(held.append)
            if failed:
                log.warning(
                    "%s failed and is left out for the rest of the run (training, checkpoints "
                    "and metrics.csv go on): %s", type(logger).__name__, first_line(failed[0]),
                )  # fmt: skip
                return None
            for record in held:
                logging.getLogger(record.name).handle(record)
            return result

        return write_unless_failed

    for name in WRITES:  # on the instance: the logger keeps its class, which Lightning looks for
        setattr(logger, name, guarded(getattr(logger, name)))


def first_line(error: BaseException) -> str:
    """The first line of the root error (MLflow's wraps SQLAlchemy's, which wraps sqlite3's)."""
    while error.__cause__ or error.__context__:
        error = error.__cause__ or error.__context__
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
