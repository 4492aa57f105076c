"""The path of a run: config -> data, model, callbacks, loggers, trainer -> fit -> test."""

import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.errors import CompactHydraException
from hydra.types import RunMode
from lightning.pytorch.callbacks import (
    Callback,
    LearningRateMonitor,
    ModelCheckpoint,
    ModelSummary,
    ProgressBar,
)
from lightning.pytorch.callbacks.early_stopping import EarlyStoppingReason
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_only, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf, open_dict

from kindling import train_checks as checks
from kindling.callbacks.interrupt import CheckpointOnInterrupt
from kindling.callbacks.resume import ResumeExactly
from kindling.config import resolvers  # noqa: F401 - importing registers the resolvers
from kindling.config.config_tree import print_config_tree
from kindling.config.instantiate import build, check_arguments, instantiate_group
from kindling.data.contract import DescribesItself, HasBatchShapes, check_data_module
from kindling.data.loaders import per_device_batch_size
from kindling.errors import UserError, find_user_error, message
from kindling.files import is_url
from kindling.hardware import best_precision
from kindling.known_warnings import ignore_unhelpful_warnings
from kindling.run import LAST_CHECKPOINT, failures, job_record, provenance, run_folder

log = logging.getLogger(__name__)


class JobError(UserError, CompactHydraException):
    """A multirun job's UserError: Hydra records the job as failed, runs the others, and at the
    end of the multirun prints the message alone."""


def run(cfg: DictConfig) -> float | None:
    """Train and/or test as `cfg` says; return the value of `cfg.optimized_metric` (or None).
    A UserError ends the run with its message alone (exit 1; raised in a multirun, whose other
    jobs go on, and with HYDRA_FULL_ERROR=1)."""
    ignore_unhelpful_warnings()
    if HydraConfig.initialized():
        # Into Hydra's handlers (console and train.log): Lightning imported before logging was
        # configured gave itself a console handler.
        for name in ("lightning", "lightning.pytorch", "lightning.fabric"):
            library_log = logging.getLogger(name)
            for handler in [h for h in library_log.handlers if type(h) is logging.StreamHandler]:
                library_log.removeHandler(handler)
            library_log.propagate = True
        logging.captureWarnings(True)
    earlier = _earlier_job(cfg.paths.output_dir)
    if earlier == "completed":  # a continued multirun's: its folder is left as it was
        return job_record.kept(cfg.paths.output_dir, cfg.get("optimized_metric"))
    if earlier == "resume":
        with open_dict(cfg):
            cfg.ckpt_path = str(Path(cfg.paths.output_dir) / LAST_CHECKPOINT)
    previous_handler = _exit_on_sigterm()
    try:
        run_folder.refuse_used(cfg.paths.output_dir)  # before job.yaml replaces the earlier one
        with job_record.job_environment(), job_record.recorded_job(cfg.paths.output_dir):
            return train_and_test(cfg)
    except SIGTERMException as stop:
        # Lightning stopped at the end of a step; CheckpointOnInterrupt said where it saved
        # and set the status: 128 + the signal (SIGTERM, or Ctrl-C during training).
        sys.exit(128 + signal.SIGTERM if stop.code is None else stop.code)
    except Exception as error:
        user_error = find_user_error(error)
        if user_error is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        if rank_zero_only.rank == 0 or not user_error.raised_on_every_rank:
            log.error("%s", message(user_error))
        if isinstance(user_error, failures.PartFailed) and user_error.rank != 0:
            failures.keep_in_log(user_error, cfg.paths.output_dir)
        if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
            raise JobError(message(user_error)) from error
        sys.exit(1)
    finally:
        wandb = sys.modules.get("wandb")  # finished: the next job of a multirun starts its own
        if wandb is not None and wandb.run is not None:
            wandb.finish()
        run_folder.release(cfg.paths.output_dir)
        if previous_handler is not None:
            signal.signal(signal.SIGTERM, previous_handler)


def _earlier_job(output_dir: str) -> str | None:
    """What a job of a continued multirun finds in its folder (kindling/run/continuation.py)."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    from kindling.run.continuation import earlier_job

    return earlier_job(output_dir, list(HydraConfig.get().overrides.task))


def _stopped_as_training_ended(trainer: L.Trainer) -> None:
    """A signal in the last step: CheckpointOnInterrupt saved the complete training and said
    so; the run ends there, untested, with 128 + the signal."""
    signals = [c.stopped_by for c in trainer.callbacks if isinstance(c, CheckpointOnInterrupt)]
    stop = SIGTERMException()
    stop.code = 128 + next((signum for signum in signals if signum), signal.SIGTERM)
    raise stop


def _exit_on_sigterm() -> Any:
    """SIGTERM outside a stage (where CheckpointOnInterrupt stops at a step's end) exits at once
    with 143, saying so. Returns the handler it replaced."""

    def stop(signum: int, frame: Any) -> None:
        log.warning("Stopped by SIGTERM outside training: nothing more was saved.")
        raise SystemExit(128 + signum)

    try:
        return signal.signal(signal.SIGTERM, stop)
    except ValueError:  # not the main thread: the default handler stays
        return None


def train_and_test(cfg: DictConfig) -> float | None:
    augment_images_only(cfg.data)
    try:  # a refused resume leaves its run folder as it was
        checkpoint = _check(cfg)
        record_dir = run_folder.record_dir(cfg.paths.output_dir)  # a resumed run keeps the first's
        print_config_tree(cfg, save_dir=record_dir, to_console=cfg.get("print_config", False))
        run_provenance = provenance.collect()
        provenance.save(run_provenance, record_dir)
        if cfg.get("seed") is not None:  # 0 is a seed like any other
            L.seed_everything(cfg.seed, workers=True)
        if cfg.get("float32_matmul_precision"):
            torch.set_float32_matmul_precision(cfg.float32_matmul_precision)

        datamodule: L.LightningDataModule = build(cfg.data, "data")
        check_data_module(datamodule, train=bool(cfg.get("train")), test=bool(cfg.get("test")))
        fill_in_from_data(cfg.data, datamodule)
        checks.check_model_reads_data(cfg)  # with what the data filled in
        check_arguments(cfg.model, "model")
        model: L.LightningModule = build(cfg.model, "model")
        if checkpoint is not None:  # the weights' shapes are known once the model is built
            from kindling.run.starting_checkpoint import check_weights_fit

            check_weights_fit(checkpoint, model)
        if cfg.get("weights_from") is not None:
            from kindling.run.starting_checkpoint import start_from_weights

            start_from_weights(cfg.weights_from, model)
    except UserError:
        run_folder.forget_refused(cfg.paths.output_dir)
        raise
    trainer = build_trainer(cfg, run_provenance, datamodule=datamodule)

    rank_zero_info(f"Run folder: {cfg.paths.output_dir}")
    hparams = {**OmegaConf.to_container(cfg, resolve=True)}
    hparams["provenance"] = provenance.summary(run_provenance)
    if all(isinstance(logger, CSVLogger) for logger in trainer.loggers):  # the run's own record
        for logger in trainer.loggers:
            logger.log_hyperparams(hparams)
    else:
        from kindling.loggers import trackers  # MLflow, W&B, TensorBoard, ...

        trackers.start(cfg.get("logger"), trainer.loggers, hparams, run_provenance)

    try:
        # A rank that ends is said in one line, however the run learns of it (run/failures.py).
        with failures.said_when_lightning_ends_the_run(trainer, cfg.paths.output_dir):
            if cfg.get("train"):
                trainer.fit(model=model, datamodule=datamodule, ckpt_path=checkpoint)
                if trainer.received_sigterm:  # agreed in the last step: training ended all the same
                    _stopped_as_training_ended(trainer)
            metrics = dict(trainer.callback_metrics)
            tested = None
            if cfg.get("test"):
                tested = _tested_checkpoint(trainer) if cfg.get("train") else checkpoint
                trainer.test(model=model, datamodule=datamodule, ckpt_path=tested)
                metrics.update(trainer.callback_metrics)
    except Exception as error:
        # A full disk or a rank that died: one line and the resume command (run/failures.py).
        explained = failures.explain(error, trainer, cfg.paths.output_dir)
        # Lightning ends the ranks it started only on Ctrl-C: one still connecting to this
        # process's store would retry for 30 minutes, the command with it.
        if trainer.strategy.launcher is not None:
            trainer.strategy.launcher.kill(signal.SIGKILL)
        if explained is None:
            raise
        raise explained from error

    job_record.save_results(metrics, cfg.paths.output_dir)
    rank_zero_info(run_summary(trainer, metrics, cfg.paths.output_dir, tested))
    # A test-only run (train=false) has no validation metrics to return.
    name = cfg.get("optimized_metric") if cfg.get("train") else None
    if name and name not in metrics:
        logged = ", ".join(sorted(metrics))
        raise UserError(f"optimized_metric={name!r} was not logged. Logged metrics: {logged}.")
    return float(metrics[name]) if name else None


def fill_in_from_data(data: DictConfig, datamodule: L.LightningDataModule) -> None:
    """The `data.` keys the config leaves null, from the data module's `describe()` (a folder's
    class count, a table's features): `${data.num_classes}` in the model's config then reads the
    real value, and composing a config (`--cfg job`) reads no data."""
    if isinstance(datamodule, DescribesItself):
        found = {k: v for k, v in datamodule.describe().items() if data.get(k) is None}
        datamodule.hparams.update(found)
        with open_dict(data):
            data.merge_with(found)


def augment_images_only(data: DictConfig) -> None:
    """Drop `data.augment` where the data has no images (data=streaming on sequences): the crop
    reads the null `data.image_shape`, which would stop the config from resolving."""
    if data.get("augment") and data.get("image_shape") is None:
        with open_dict(data):
            del data["augment"]


def build_trainer(
    cfg: DictConfig,
    run_provenance: dict,
    extra_callbacks: Sequence[Callback] = (),
    datamodule: L.LightningDataModule | None = None,
) -> L.Trainer:
    """The Trainer of `cfg.trainer` with the configured callbacks and loggers (and, for the
    benchmarks, `extra_callbacks`). A null `precision` becomes this device's best, a null
    `benchmark` true where the data module's batches have `fixed_batch_shapes`: the recorded
    config says what the run trained with."""
    with open_dict(cfg.trainer):
        if cfg.trainer.get("precision") is None:
            cfg.trainer.precision = best_precision(cfg.trainer.get("accelerator", "auto"))
        if cfg.trainer.get("benchmark") is None:
            fixed = isinstance(datamodule, HasBatchShapes) and datamodule.fixed_batch_shapes
            cfg.trainer.benchmark = bool(fixed and not cfg.trainer.get("deterministic"))
    callbacks = [*instantiate_group(cfg.get("callbacks"), "callbacks"), *extra_callbacks]
    loggers = instantiate_group(cfg.get("logger"), "logger")
    # `trainer.enable_progress_bar=false` and the like drop their callbacks, which Lightning would
    # refuse (or run anyway); LearningRateMonitor refuses to run without a logger.
    switches = {"enable_progress_bar": ProgressBar, "enable_model_summary": ModelSummary}
    switches["enable_checkpointing"] = ModelCheckpoint
    dropped = tuple(kind for flag, kind in switches.items() if cfg.trainer.get(flag) is False)
    dropped += () if loggers else (LearningRateMonitor,)
    callbacks = [c for c in callbacks if not isinstance(c, dropped)]
    # The run's guarantees, whatever its callbacks: self-contained checkpoints and exact resumes
    # (the run's record, which no YAML value holds), and a checkpoint on SIGTERM or Ctrl-C, last
    # as it holds back a signal that arrived during any other callback's validation hooks.
    callbacks.append(ResumeExactly(OmegaConf.to_container(cfg, resolve=True), run_provenance))
    if cfg.get("interrupt") is not None:
        callbacks.append(build(cfg.interrupt, "interrupt"))
    trainer = build(cfg.trainer, "trainer", callbacks=callbacks, logger=loggers or False)
    if trainer.world_size > 1 and HydraConfig.initialized():
        # Lightning starts the extra ranks: as runs of this job (a private part of Lightning).
        from kindling.run.hydra_ddp import start_ranks_as_this_job

        start_ranks_as_this_job()
    return trainer


def _check(cfg: DictConfig) -> str | None:
    """Fail on bad input before any work; return the checkpoint file to start from, if any."""
    run_folder.hold(cfg.paths.output_dir)  # first: a folder in use is refused for that alone
    checks.check_model_fits_data(cfg)
    checks.check_seed(cfg.get("seed"))
    # Every object's config against its target's signature, before anything is built (the
    # model's once the data has filled in what only it knows: fill_in_from_data).
    for group in ("data", "callbacks", "logger", "trainer", "interrupt"):
        check_arguments(cfg.get(group), group)
    checks.check_accelerator(cfg.trainer)
    if run_folder.launched():
        from kindling.run.launched import check_launched_processes

        check_launched_processes(cfg.trainer)
    checks.check_tracking_uri(cfg.get("logger"))
    if "batch_size" in cfg.data:
        per_device_batch_size(cfg.data.batch_size, checks.requested_world_size(cfg.trainer))
    if cfg.get("weights_from") is not None and (cfg.get("ckpt_path") or not cfg.get("train")):
        raise UserError(
            "weights_from starts a new training run from a checkpoint's weights; ckpt_path "
            "resumes (or, with train=false, tests) one. Give one of them."
        )
    if cfg.get("ckpt_path") is not None:
        from kindling.run.starting_checkpoint import checked_checkpoint

        return checked_checkpoint(cfg)
    if not cfg.get("train") and cfg.get("test"):
        raise UserError("train=false tests a checkpoint: give it with ckpt_path=<file>.")
    return None


def run_summary(trainer: L.Trainer, metrics: dict, run_dir: str, tested: str | None) -> str:
    """The best checkpoint and its score, the test metrics and the weights they are of (the
    checkpoint `tested`, or those training ended with), the pictures, the run folder."""
    lines = []
    best = trainer.checkpoint_callback
    if best is not None and best.best_model_path and best.best_model_score is not None:
        lines.append(
            f"Best: {best.monitor} {float(best.best_model_score):.4f}, {best.best_model_path}"
        )
    test = ", ".join(
        f"{k} {float(v):.4f}" for k, v in sorted(metrics.items()) if k.startswith("test/")
    )
    if test:
        lines.append(f"Test: {test} ({tested or 'the weights training ended with'})")
    pictures = sorted(p.name for p in Path(run_dir).glob("*.png"))
    if pictures:
        lines.append(f"Pictures: {', '.join(pictures)}")
    return "\n".join([*lines, f"Run folder: {run_dir}"])


def _tested_checkpoint(trainer: L.Trainer) -> str | None:
    """None, the weights training ended with (the end of the learning-rate schedule); where
    early stopping ended training, its best checkpoint instead, found again if the run folder
    moved. A validation split of a few samples cannot choose an epoch (docs/data.md)."""
    stopper, callback = trainer.early_stopping_callback, trainer.checkpoint_callback
    if stopper is None or stopper.stopping_reason == EarlyStoppingReason.NOT_STOPPED:
        return None
    if not (callback and callback.best_model_path):
        rank_zero_warn("No best checkpoint was saved: testing the weights at the end of training.")
        return None
    best = callback.best_model_path
    if is_url(best) or Path(best).is_file():  # object storage: where it was written
        return best
    return str(Path(callback.dirpath) / Path(best).name)  # a resumed run's folder moved
