"""The path of a run: config -> data, model, callbacks, loggers, trainer -> fit -> test."""

import logging
import sys

import lightning as L
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from hydra.utils import instantiate
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from omegaconf import DictConfig, OmegaConf

from kindling.callbacks import ConfigInCheckpoint
from kindling.utils import UserError, hydra_ddp, instantiate_group
from kindling.utils.errors import find_user_error

log = logging.getLogger(__name__)

# Run folders are named by `${run_stamp:${paths.log_dir}}` (configs/hydra/default.yaml);
# cached, like Hydra's own `now`, so a sweep folder is named once.
OmegaConf.register_new_resolver("run_stamp", hydra_ddp.run_stamp, use_cache=True, replace=True)
# trainer=gpu_per_job gives job N of a parallel sweep its own GPU: `devices: ${job_device:}`.
OmegaConf.register_new_resolver("job_device", hydra_ddp.job_device, replace=True)


def run(cfg: DictConfig) -> float | None:
    """Train and/or test as `cfg` says; return the value of `cfg.optimized_metric` (or None).

    Bad input stops a single run with its message alone (no traceback; exit code 1). In a
    multirun the error is raised, so Hydra records the job as failed and runs the others.
    """
    # Multi-device jobs start their extra ranks as single runs of this job, in its folder.
    hydra_ddp.install()
    try:
        with hydra_ddp.job_environment():
            return train_and_test(cfg)
    except Exception as error:
        user_error = find_user_error(error)
        if user_error is not None and not _in_multirun():
            log.error("%s", user_error)
            sys.exit(1)
        raise


def train_and_test(cfg: DictConfig) -> float | None:
    if cfg.get("seed") is not None:  # 0 is a seed like any other
        L.seed_everything(cfg.seed, workers=True)

    # _convert_="all": objects get plain lists and dicts, never OmegaConf containers, so what they
    # save into checkpoints loads with torch.load(weights_only=True).
    datamodule: L.LightningDataModule = instantiate(cfg.data, _convert_="all")
    model: L.LightningModule = instantiate(cfg.model, _convert_="all")
    loggers = instantiate_group(cfg.get("logger"))
    config = OmegaConf.to_container(cfg, resolve=True)
    callbacks = [*instantiate_group(cfg.get("callbacks")), ConfigInCheckpoint(config)]
    if not loggers:
        # LearningRateMonitor refuses to run without a logger; there is nothing to record to.
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    trainer: L.Trainer = instantiate(
        cfg.trainer, callbacks=callbacks, logger=loggers or False, _convert_="all"
    )

    rank_zero_info(f"Run folder: {cfg.paths.output_dir}")
    for logger in trainer.loggers:  # Lightning calls loggers on rank 0 only
        logger.log_hyperparams(config)

    if cfg.get("train"):
        trainer.fit(model=model, datamodule=datamodule, ckpt_path=cfg.get("ckpt_path"))
    metrics = dict(trainer.callback_metrics)

    if cfg.get("test"):
        trainer.test(model=model, datamodule=datamodule, ckpt_path=_test_checkpoint(cfg, trainer))
        metrics.update(trainer.callback_metrics)

    rank_zero_info(f"Run folder: {cfg.paths.output_dir}")
    # A test-only run (train=false) has no validation metrics to return.
    name = cfg.get("optimized_metric") if cfg.get("train") else None
    return _optimized_metric(name, metrics)


def _in_multirun() -> bool:
    # A SystemExit would end the whole sweep; an exception lets Hydra finish the other jobs.
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def _test_checkpoint(cfg: DictConfig, trainer: L.Trainer) -> str | None:
    """Test the best checkpoint of this fit, or `ckpt_path` when not training."""
    if not cfg.get("train"):
        return cfg.get("ckpt_path")
    best = trainer.checkpoint_callback.best_model_path if trainer.checkpoint_callback else ""
    if not best:
        rank_zero_warn("No best checkpoint was saved: testing the weights at the end of training.")
        return None
    return best


def _optimized_metric(name: str | None, metrics: dict) -> float | None:
    if not name:
        return None
    if name not in metrics:
        logged = ", ".join(sorted(metrics))
        raise UserError(f"optimized_metric={name!r} was not logged. Logged metrics: {logged}.")
    return float(metrics[name])
