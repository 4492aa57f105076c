"""Learning-rate schedules follow the run's real length, in epochs or in steps, and resume."""

import functools
import itertools
import math
from pathlib import Path

import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from omegaconf import DictConfig, open_dict

from kindling.errors import UserError
from kindling.modules.optimization import takes_total_steps, warmup_cosine

from helpers import CONFIG_DIR, options, quiet_trainer

LM_MODELS = sorted(f"lm/{p.stem}" for p in (CONFIG_DIR / "model" / "lm").glob("*.yaml"))


def lr_curve(total_steps: int, **kwargs) -> list[float]:
    """The learning rate of each optimizer step 0..total_steps (the last: after the run)."""
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = warmup_cosine(optimizer, total_steps=total_steps, **kwargs)
    lrs = []
    for _ in range(total_steps + 1):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return lrs


def test_warmup_cosine_warms_up_then_decays_to_its_floor() -> None:
    lrs = lr_curve(100, warmup_ratio=0.1, min_lr_ratio=0.1)
    # nanoGPT's get_lr: (s + 1) / (w + 1) for the 10 warmup steps, the peak at step 10.
    assert lrs[:11] == pytest.approx([(s + 1) / 11 for s in range(10)] + [1.0])
    decay = lrs[10:]
    assert all(a > b for a, b in itertools.pairwise(decay))
    assert lrs[55] == pytest.approx(0.1 + 0.9 * 0.5)  # halfway down the cosine
    assert lrs[-1] == pytest.approx(0.1)
    assert min(lrs) > 0


def test_warmup_is_a_share_of_any_run_down_to_one_step() -> None:
    assert lr_curve(1, warmup_ratio=0.05, min_lr_ratio=0.1) == pytest.approx([1.0, 0.1])
    assert lr_curve(2000, warmup_ratio=0.05)[99:101] == pytest.approx([100 / 101, 1.0])


@pytest.mark.parametrize(
    "kwargs", [{"warmup_ratio": 1.0}, {"warmup_ratio": -0.1}, {"min_lr_ratio": 2.0}]
)
def test_bad_schedule_values_are_user_errors(kwargs: dict) -> None:
    with pytest.raises(UserError, match=r"model\.scheduler\.(warmup_ratio|min_lr_ratio)"):
        lr_curve(10, **kwargs)


def test_only_factories_with_a_free_total_steps_get_the_run_length() -> None:
    lr = torch.optim.lr_scheduler
    assert takes_total_steps(functools.partial(warmup_cosine, warmup_ratio=0.1))
    assert takes_total_steps(functools.partial(lr.OneCycleLR, max_lr=0.1))
    assert not takes_total_steps(functools.partial(lr.OneCycleLR, max_lr=0.1, total_steps=7))
    assert not takes_total_steps(functools.partial(lr.ReduceLROnPlateau))


@pytest.mark.parametrize("model", [*options("model"), *LM_MODELS])
def test_every_model_config_schedules_per_step_over_the_run(compose_config, model) -> None:
    cfg = compose_config(f"model={model}", *(["experiment=charlm"] if "lm/" in model else []))
    assert cfg.model.scheduler._target_ == "kindling.modules.optimization.warmup_cosine"
    assert cfg.model.scheduler_interval == "step"
    lrs = lr_curve(50, **{k: v for k, v in cfg.model.scheduler.items() if "ratio" in k})
    assert lrs[-1] == pytest.approx(cfg.model.scheduler.min_lr_ratio)
    assert min(lrs[:-1]) > 0


# --------------------------------------------------------------------------------------------
# In a Trainer: the length comes from trainer.estimated_stepping_batches


class RecordLearningRate(Callback):
    """The learning rate each optimizer step trains with, by global step."""

    def __init__(self) -> None:
        self.lrs: dict[int, float] = {}

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.lrs[trainer.global_step] = trainer.optimizers[0].param_groups[0]["lr"]


def digits_cfg(compose_config, **trainer: object) -> DictConfig:
    cfg = compose_config("model.net.channels=[4]", "data.batch_size=128")
    with open_dict(cfg):
        cfg.model.scheduler.warmup_ratio = 0.2
        cfg.model.scheduler.min_lr_ratio = 0.1
        cfg.trainer.update(trainer)
    return cfg


def fit(cfg: DictConfig, tmp_path: Path, *callbacks: Callback, ckpt_path: str | None = None):
    trainer = quiet_trainer(
        max_steps=cfg.trainer.get("max_steps", -1),
        max_epochs=cfg.trainer.max_epochs,
        limit_train_batches=cfg.trainer.get("limit_train_batches", 1.0),
        limit_val_batches=1,
        num_sanity_val_steps=0,
        callbacks=list(callbacks),
        enable_checkpointing=any(isinstance(c, ModelCheckpoint) for c in callbacks),
        default_root_dir=tmp_path,
    )
    model = instantiate(cfg.model, _convert_="all")
    trainer.fit(model, datamodule=instantiate(cfg.data, _convert_="all"), ckpt_path=ckpt_path)
    return trainer


def test_a_step_based_run_warms_up_and_ends_at_its_floor(compose_config, tmp_path) -> None:
    """trainer.max_steps=30 trainer.max_epochs=-1: the schedule spans 30 steps, over epochs."""
    cfg = digits_cfg(compose_config, max_steps=30, max_epochs=-1)
    record = RecordLearningRate()
    trainer = fit(cfg, tmp_path, record)
    lr = cfg.model.optimizer.lr
    lrs = [record.lrs[step] for step in range(30)]
    assert trainer.current_epoch > 1  # the 30 steps cross epochs (11 batches each)
    assert min(lrs) > 0.09 * lr  # never 0 before the end
    assert lrs[:7] == pytest.approx([lr * (s + 1) / 7 for s in range(6)] + [lr])  # warmup
    assert all(a > b for a, b in itertools.pairwise(lrs[6:]))  # then only down
    assert lrs[-1] == pytest.approx(lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 23 / 24))))
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(0.1 * lr)  # the floor


def test_an_epoch_based_run_spans_its_epochs(compose_config, tmp_path) -> None:
    cfg = digits_cfg(compose_config, max_epochs=3, limit_train_batches=4)
    record = RecordLearningRate()
    trainer = fit(cfg, tmp_path, record)
    assert sorted(record.lrs) == list(range(12))
    assert trainer.optimizers[0].param_groups[0]["lr"] == pytest.approx(
        0.1 * cfg.model.optimizer.lr
    )


def test_a_run_of_unknown_length_is_refused(compose_config, tmp_path) -> None:
    cfg = digits_cfg(compose_config, max_epochs=-1)
    with pytest.raises(UserError, match=r"trainer\.max_steps=<steps>.*model\.scheduler=null"):
        fit(cfg, tmp_path)


def test_a_total_steps_schedule_stepped_per_epoch_is_refused(compose_config, tmp_path) -> None:
    cfg = digits_cfg(compose_config, max_epochs=1)
    with open_dict(cfg):
        cfg.model.scheduler_interval = "epoch"
    with pytest.raises(UserError, match=r"model\.scheduler_interval=step"):
        fit(cfg, tmp_path)


def test_any_torch_scheduler_still_fits(compose_config, tmp_path) -> None:
    cfg = digits_cfg(compose_config, max_epochs=3, limit_train_batches=2)
    with open_dict(cfg):
        cfg.model.scheduler = {
            "_target_": "torch.optim.lr_scheduler.ReduceLROnPlateau",
            "_partial_": True,
            "patience": 0,
            "factor": 0.5,
        }
        cfg.model.scheduler_interval = "epoch"
    trainer = fit(cfg, tmp_path)
    scheduler = trainer.lr_scheduler_configs[0].scheduler
    assert isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    assert trainer.lr_scheduler_configs[0].monitor == "val/loss"


def test_a_resumed_step_based_run_continues_the_curve(compose_config, tmp_path) -> None:
    cfg = digits_cfg(compose_config, max_steps=24, max_epochs=-1)
    straight = RecordLearningRate()
    every_10 = ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=10, save_top_k=-1)
    fit(cfg, tmp_path, straight, every_10)
    resumed = RecordLearningRate()
    fit(cfg, tmp_path, resumed, ckpt_path=str(next((tmp_path / "ckpt").glob("*step=10.ckpt"))))
    assert sorted(resumed.lrs) == list(range(10, 24))
    assert [resumed.lrs[s] for s in range(10, 24)] == [straight.lrs[s] for s in range(10, 24)]
