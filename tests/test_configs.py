"""Every config option composes, and its objects build from config alone."""

import pytest
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf

from kindling.data.batched import BatchedDataModule
from kindling.modules import Classifier

from conftest import options

GROUPS = ["data", "augment", "model", "trainer", "callbacks", "logger", "experiment", "debug"]


@pytest.fixture
def image_folder(tmp_path):
    """A data.path for data=image_folder: two class folders of one tiny PNG each."""
    from PIL import Image

    for name in ("cat", "dog"):
        (tmp_path / "images" / name).mkdir(parents=True)
        Image.new("RGB", (4, 4)).save(tmp_path / "images" / name / "0.png")
    return tmp_path / "images"


def with_data_path(overrides: list[str], folder) -> list[str]:
    """data=image_folder needs data.path (its class count is read from the folder)."""
    return [*overrides, f"data.path={folder}"] if "data=image_folder" in overrides else overrides


def test_every_group_has_options() -> None:
    for group in GROUPS:
        assert options(group), f"configs/{group}/ has no options"
    assert options("model") == ["cnn", "lstm", "rnn", "transformer"]
    assert options("data") == ["cifar10", "digits", "fashion_mnist", "image_folder", "mnist"]
    assert options("augment") == ["crop", "flip_crop", "none", "trivial_augment"]
    assert {"default", "cpu", "gpu", "ddp", "ddp_cpu", "mps"} <= set(options("trainer"))


@pytest.mark.parametrize(
    "override", [f"{group}={option}" for group in GROUPS for option in options(group)]
)
def test_option_composes_and_resolves(compose_config, image_folder, override: str) -> None:
    cfg = compose_config(*with_data_path([override], image_folder))
    # Resolving catches broken interpolations and missing keys.
    OmegaConf.to_container(cfg, resolve=True)


@pytest.mark.parametrize("data", options("data"))
@pytest.mark.parametrize("model", options("model"))
def test_model_and_data_build_from_config(
    compose_config, image_folder, model: str, data: str
) -> None:
    cfg = compose_config(*with_data_path([f"model={model}", f"data={data}"], image_folder))
    datamodule = instantiate(cfg.data, _convert_="all")
    module = instantiate(cfg.model, _convert_="all")
    assert isinstance(datamodule, BatchedDataModule)
    assert isinstance(module, Classifier)
    # Shape and class count are typed once, in the data config.
    image_shape = list(cfg.data.image_shape)
    assert list(cfg.model.net.image_shape) == image_shape
    logits = module(torch.randn(2, *image_shape))
    assert logits.shape == (2, cfg.data.num_classes)


@pytest.mark.parametrize("model", options("model"))
def test_model_config_parts_instantiate_on_their_own(compose_config, model: str) -> None:
    cfg = compose_config(f"model={model}")
    net = instantiate(cfg.model.net)
    optimizer = instantiate(cfg.model.optimizer)(params=net.parameters())
    scheduler = instantiate(cfg.model.scheduler)(optimizer=optimizer)
    assert isinstance(optimizer, torch.optim.Optimizer)
    assert optimizer.param_groups[0]["lr"] == cfg.model.optimizer.lr
    assert scheduler.T_max == cfg.trainer.max_epochs


def test_experiment_overrides_several_groups(compose_config) -> None:
    cfg = compose_config("experiment=example")
    assert cfg.model.net._target_ == "kindling.models.LSTMClassifier"
    assert cfg.model.net.hidden_size == 64
    assert cfg.seed == 0
    assert cfg.task_name == "example"


def test_cpu_trainer_configs_build_a_trainer(compose_config, tmp_path) -> None:
    for option, devices in [("cpu", 1), ("ddp_cpu", 2)]:
        cfg = compose_config(f"trainer={option}")
        trainer = instantiate(cfg.trainer, logger=False, enable_checkpointing=False)
        assert trainer.num_devices == devices
        assert type(trainer.accelerator).__name__ == "CPUAccelerator"


def test_ddp_config_uses_gpus_and_syncs_batch_norm(compose_config) -> None:
    cfg = compose_config("trainer=ddp")
    assert cfg.trainer.strategy == "ddp"
    assert cfg.trainer.accelerator == "gpu"
    assert cfg.trainer.sync_batchnorm is True


def test_callbacks_and_loggers_are_named_entries(compose_config) -> None:
    cfg = compose_config()
    assert set(cfg.callbacks) >= {
        "model_checkpoint",
        "early_stopping",
        "rich_progress_bar",
        "rich_model_summary",
        "learning_rate_monitor",
        "stop_on_divergence",
    }
    assert cfg.callbacks.model_checkpoint.save_last is True
    assert cfg.callbacks.model_checkpoint.monitor == "val/acc"
    assert set(cfg.logger) == {"csv"}
    assert not compose_config("callbacks=none").callbacks
    assert not compose_config("logger=none").logger


def test_top_level_keys(compose_config) -> None:
    cfg = compose_config("seed=0")
    assert cfg.seed == 0
    for key in ["train", "test", "ckpt_path", "task_name", "tags", "optimized_metric"]:
        assert key in cfg
    assert cfg.trainer.accelerator == "auto" and cfg.trainer.devices == 1
