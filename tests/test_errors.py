"""Every config mistake ends in one line naming its key and value, whenever the object is built;
a bug in the project's own code keeps its traceback."""

import importlib
import traceback
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import wandb as wandb_logger
from lightning.pytorch.utilities import rank_zero_only
from lightning_utilities.core.imports import RequirementCache
from omegaconf import DictConfig, OmegaConf
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kindling.config.instantiate import ConfigFactory, build
from kindling.data.text import Vocabulary
from kindling.errors import UserError
from kindling.train import run

from helpers import QUIET, error_lines, prepare_cfg, train_py, train_py_here

# fast_dev_run without debug=fdr, which turns off the logger and early stopping.
FAST = ["trainer=cpu", "++trainer.fast_dev_run=true", *QUIET]

MISTAKES = {
    # Found inside trainer.fit: configure_optimizers calls the optimizer and scheduler factories.
    "optimizer value": (
        ["model.optimizer.lr=-1"],
        "model.optimizer (torch.optim.AdamW) refused its values: Invalid learning rate: -1. "
        "Check the values under model.optimizer; you set model.optimizer.lr=-1.",
    ),
    "scheduler value": (
        [
            "model.scheduler._target_=torch.optim.lr_scheduler.LinearLR",
            "~model.scheduler.warmup_ratio",
            "~model.scheduler.min_lr_ratio",
            "+model.scheduler.start_factor=2",
        ],
        "model.scheduler (torch.optim.lr_scheduler.LinearLR) refused its values: Starting "
        "multiplicative factor expected to be greater than 0 and less or equal to 1. Check the "
        "values under model.scheduler; you set model.scheduler._target_=torch.optim.lr_scheduler"
        ".LinearLR, model.scheduler.start_factor=2.",
    ),
    "scheduler unknown argument": (
        ["+model.scheduler.warmup=5"],
        "model.scheduler.warmup=5: kindling.modules.optimization.warmup_cosine takes no argument "
        "'warmup' (it takes optimizer, total_steps, warmup_ratio, min_lr_ratio). "
        "Remove model.scheduler.warmup",
    ),
    # Found when the config is instantiated.
    "net value a library refuses": (
        ["model=lstm", "model.net.num_layers=0"],
        "model.net (kindling.models.recurrent.LSTMClassifier) refused its values: "
        "num_layers must be "
        "greater than zero. Check the values under model.net; you set model.net.num_layers=0.",
    ),
    "net value kindling refuses": (
        ["model=transformer", "model.net.num_heads=3"],
        "model.net (kindling.models.transformer.TransformerClassifier) refused its values: "
        "d_model=64 must "
        "be divisible by num_heads=3. Check the values under model.net; you set "
        "model.net.num_heads=3.",
    ),
    "net value of the wrong type": (
        ["model.net.channels=5"],
        "model.net.channels=5 has the wrong type: kindling.models.cnn.CNNClassifier takes "
        "channels: "
        "Sequence[int]",
    ),
    "net unknown argument": (
        ["+model.net.foo=1"],
        "model.net.foo=1: kindling.models.cnn.CNNClassifier takes no argument 'foo' (it takes "
        "image_shape, num_classes, channels, dropout).",
    ),
    "net missing argument": (
        ["~model.net.num_classes"],
        "model.net: kindling.models.cnn.CNNClassifier needs num_classes. "
        "Add +model.net.num_classes=<value>.",
    ),
    "net target that does not exist": (
        ["model.net._target_=kindling.models.cnn.Nope"],
        "model.net._target_=kindling.models.cnn.Nope: kindling.models.cnn has no Nope (it has "
        "CNNClassifier, conv_block)",
    ),
    "callback value": (
        ["callbacks=[default,early_stopping]", "callbacks.early_stopping.mode=sideways"],
        "callbacks.early_stopping (lightning.pytorch.callbacks.EarlyStopping) refused its "
        "values: `mode` can be min, max, got sideways. Check the values under "
        "callbacks.early_stopping; you set callbacks.early_stopping.mode=sideways.",
    ),
    "logger unknown argument": (
        ["+logger.csv.colour=red"],
        "logger.csv.colour=red: kindling.loggers.resumable_csv.ResumableCSVLogger takes no "
        "argument 'colour'",
    ),
    "data unknown argument": (
        ["+data.shuffle=true"],
        "data.shuffle=true: kindling.data.digits.DigitsDataModule takes no argument 'shuffle' "
        "(it takes "
        "test_fraction, data_dir,",
    ),
    "trainer value": (
        ["trainer.max_epochs=-5"],
        "trainer (lightning.pytorch.Trainer) refused its values: `max_epochs` must be a "
        "non-negative integer or -1. You passed in -5. Check the values under trainer; you set "
        "trainer.max_epochs=-5",
    ),
    "trainer target that does not exist": (
        ["trainer._target_=lightning.pytorch.Trainr"],
        "lightning.pytorch has no Trainr (it has Callback, LightningDataModule, LightningModule, "
        "Trainer, seed_everything). Change trainer._target_.",
    ),
}


class DataWithoutATestLoader(L.LightningDataModule):
    """A data module of one's own that serves training and validation, and no test."""

    def __init__(self, num_classes: int, image_shape: list[int], batch_size: int) -> None:
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self) -> DataLoader:
        images, labels = torch.rand(8, 1, 8, 8), torch.randint(0, 10, (8,))
        return DataLoader(TensorDataset(images, labels), batch_size=self.batch_size)

    val_dataloader = train_dataloader


class NotADataModule:
    def __init__(self, num_classes: int, image_shape: list[int], batch_size: int) -> None:
        pass


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("DataWithoutATestLoader", "DataWithoutATestLoader has no test_dataloader(), which this "
         "run needs: define it, or run with test=false."),
        ("NotADataModule", "data._target_ builds a NotADataModule, not a LightningDataModule"),
    ],
)  # fmt: skip
def test_a_data_module_that_cannot_serve_the_run_is_refused_before_it_trains(
    compose_config, caplog, tmp_path: Path, target: str, message: str
) -> None:
    own_data = [f"+data._target_={__name__}.{target}", "+data.num_classes=10",
                "+data.image_shape=[1,8,8]", "+data.batch_size=4"]  # fmt: skip
    cfg = compose_config("~data", *own_data, "trainer=cpu", *QUIET)
    with pytest.raises(SystemExit) as stopped:
        run(cfg)
    assert stopped.value.code == 1
    (line,) = error_lines(caplog)
    assert message in line
    assert not list(tmp_path.rglob("*.ckpt"))  # refused before the first step


@pytest.mark.parametrize("case", MISTAKES)
def test_a_config_mistake_ends_in_one_line_naming_its_key(
    compose_config, caplog, case: str
) -> None:
    overrides, message = MISTAKES[case]
    with pytest.raises(SystemExit) as stopped:
        run(compose_config(*overrides, *FAST))
    assert stopped.value.code == 1
    (line,) = error_lines(caplog)
    assert message in line
    assert "\n" not in line


class NetWithABug(nn.Module):
    """A net whose constructor fails on an operation (not a check), whatever its arguments."""

    def __init__(self, image_shape: list[int], num_classes: int, width: int = 8) -> None:
        super().__init__()
        self.head = nn.Linear(width, num_classes)
        self.depth = len(width)  # the bug: a TypeError no config value explains


class NetWithABugInForward(nn.Module):
    def __init__(self, image_shape: list[int], num_classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(image_shape[1] * image_shape[2], num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        raise ValueError("a bug in forward")


@pytest.mark.parametrize(
    ("net", "error", "where"),
    [("NetWithABug", TypeError, "__init__"), ("NetWithABugInForward", ValueError, "forward")],
)
def test_a_bug_in_the_projects_code_keeps_its_traceback(
    compose_config, caplog, net: str, error: type, where: str
) -> None:
    cfg = compose_config(
        f"model.net._target_={__name__}.{net}", "~model.net.channels", "~model.net.dropout", *FAST
    )
    with pytest.raises(error) as raised:
        run(cfg)
    assert not isinstance(raised.value, UserError) and not error_lines(caplog)
    innermost = traceback.extract_tb(raised.value.__traceback__)[-1]
    assert innermost.filename == __file__ and innermost.name == where


def language_model(**net: object) -> DictConfig:
    return OmegaConf.create(
        {
            "_target_": "kindling.modules.language_model.LanguageModel",
            "net": {
                "_target_": "kindling.models.language_models.LSTMLanguageModel",
                "_partial_": True,
                **net,
            },
            "optimizer": {"_target_": "torch.optim.AdamW", "_partial_": True},
        }
    )


def test_a_net_built_later_by_its_factory_names_its_key() -> None:
    # The language model builds its net once the data module knows the vocabulary (in fit).
    module = build(language_model(num_layers=0), "model")
    assert isinstance(module.net_factory, ConfigFactory)
    with pytest.raises(UserError, match=r"^model\.net \(.*LSTMLan.*\) refused its values: num_lay"):
        module.build(Vocabulary("abc"))
    module = build(language_model(num_layers=1), "model")
    module.build(Vocabulary("abc"))
    assert module.net.embedding.num_embeddings == 3


def test_a_bug_in_a_factory_keeps_its_traceback() -> None:
    node = OmegaConf.create(
        {"_target_": f"{__name__}.NetWithABug", "_partial_": True, "num_classes": 3}
    )
    factory = build(node, "model.net")
    assert factory.func is NetWithABug and factory.keywords == {"num_classes": 3}
    with pytest.raises(TypeError, match="has no len"):
        factory(image_shape=[1, 4, 4])


def test_a_logger_without_its_package_says_what_to_install(compose_config, monkeypatch) -> None:
    monkeypatch.setattr(wandb_logger, "_WANDB_AVAILABLE", RequirementCache("wandb>=999"))
    cfg = compose_config("logger=wandb")
    with pytest.raises(UserError, match=r"^logger\.wandb \(.*WandbLogger\) needs a package .*pip"):
        build(cfg.logger.wandb, "logger.wandb")


def test_full_error_raises_with_the_original_traceback(compose_config, monkeypatch) -> None:
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(UserError, match=r"model\.optimizer\.lr=-1") as raised:
        run(compose_config("model.optimizer.lr=-1", *FAST))
    cause = raised.value.__cause__
    assert isinstance(cause, ValueError) and cause.__traceback__ is not None
    assert traceback.extract_tb(cause.__traceback__)[-1].filename.endswith("adam.py")


def test_in_a_multirun_the_job_fails_with_its_message(compose_config, caplog) -> None:
    # Hydra records a job that raises as failed and runs the others (a SystemExit ends them all).
    with pytest.raises(UserError, match=r"model\.optimizer\.lr=-1"):
        run(compose_config("hydra.mode=MULTIRUN", "model.optimizer.lr=-1", *FAST))
    assert len(error_lines(caplog)) == 1


def test_ranks_other_than_zero_stop_without_a_message(compose_config, caplog, monkeypatch) -> None:
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    with pytest.raises(SystemExit) as stopped:
        run(compose_config("model.optimizer.lr=-1", *FAST))
    assert stopped.value.code == 1 and not error_lines(caplog)


@pytest.mark.slow
def test_two_processes_show_one_message_and_both_exit(tmp_path: Path) -> None:
    # The optimizer is built in configure_optimizers, by both ranks: each meets the mistake.
    result = train_py(
        "trainer.accelerator=cpu", "trainer.devices=2", "model.optimizer.lr=-1", "debug=fdr",
        *QUIET, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    assert "Starting with 2 processes" in output
    assert output.count("model.optimizer (torch.optim.AdamW) refused its values") == 1
    assert "Traceback" not in output


@pytest.mark.slow
def test_full_error_shows_the_whole_traceback(tmp_path: Path, monkeypatch) -> None:
    """With HYDRA_FULL_ERROR=1, Hydra's main lets the error out: Python prints it whole."""
    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    result = train_py_here("model=lstm", "model.net.num_layers=0", *FAST, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1
    assert "Traceback" in output
    assert 'raise ValueError("num_layers must be greater than zero")' in output
    assert "model.net (kindling.models.recurrent.LSTMClassifier) refused its values" in output


@pytest.mark.parametrize(
    ("tool", "argv", "named"),
    [
        ("predict", ["ckpt_path=m.ckpt", "input=test", "colour=red"], "'colour=red'"),
        ("predict", ["ckpt_path=m.ckpt"], "Missing mandatory value: input"),
        ("export", ["ckpt_path=m.ckpt", "colour=red"], "'colour=red'"),
        ("export", ["format=onnx"], "Missing mandatory value: ckpt_path"),
        ("sample", ["ckpt_path=m.ckpt", "colour=red"], "'colour=red'"),
        ("sample", ["length=5"], "Missing mandatory value: ckpt_path"),
        ("report", ["colour=red"], "colour=red has no job folders"),  # not a key: a folder
        ("report", [], "Missing mandatory value: sweep_dirs"),
        # Hydra reads prepare's overrides (config groups), and refuses an unknown key itself.
        ("prepare", ["data=digits"], "output=<folder>"),
    ],
)
def test_every_tool_names_a_bad_argument_in_one_line_and_exits_1(
    tool: str, argv: list[str], named: str, caplog, monkeypatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    main = importlib.import_module(f"kindling.{tool}").main
    with pytest.raises(SystemExit) as stopped:
        main(prepare_cfg(*argv) if tool == "prepare" else argv)  # Hydra's main takes a config
    assert stopped.value.code == 1
    (line,) = error_lines(caplog)
    assert named in line, line


def test_full_error_raises_a_tools_mistake(monkeypatch) -> None:
    from kindling import report

    monkeypatch.setenv("HYDRA_FULL_ERROR", "1")
    with pytest.raises(UserError, match="sweep_dirs"):
        report.main([])


@pytest.mark.parametrize("group", ["logger", "data/augment"])
def test_a_config_group_set_to_null_is_one_line_naming_the_way_to_drop_it(
    group: str, tmp_path: Path
) -> None:
    """Hydra refuses `<group>=null` with a traceback from its own code."""
    result = train_py_here(f"{group}=null", cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1 and "Traceback" not in output, output[-2000:]
    assert output.strip().splitlines() == [
        f"{group}=null: a config group takes one of its options by name. {group}=none runs "
        f"without one; ~{group} leaves the group out."
    ]
