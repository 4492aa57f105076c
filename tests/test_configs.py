"""Every config option composes, and its objects build from config alone."""

import csv
import inspect
import json
import os
import re
import subprocess
import sys
import typing
from pathlib import Path

import lightning as L
import pytest
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint, ModelSummary, ProgressBar
from omegaconf import OmegaConf

import kindling.train
from kindling.config.instantiate import build, instantiate_group
from kindling.data.loaders import SplitDataModule
from kindling.data.streaming import FORMAT, METADATA_FILE
from kindling.errors import UserError
from kindling.modules.classifier import Classifier
from kindling.train import fill_in_from_data, run
from kindling.train_checks import check_model_reads_data

from helpers import CONFIG_DIR, QUIET, ROOT, options

GROUPS = ["data", "data/augment", "model", "trainer", "callbacks", "logger", "experiment", "debug"]


@pytest.fixture
def image_folder(tmp_path):
    """A data.path for data=image_folder: two class folders of one tiny PNG each."""
    from PIL import Image

    for name in ("cat", "dog"):
        (tmp_path / "images" / name).mkdir(parents=True)
        Image.new("RGB", (4, 4)).save(tmp_path / "images" / name / "0.png")
    # What data=streaming reads from a prepared copy before it streams (kindling.data.streaming).
    description = {"format": FORMAT, "complete": True, "classes": ["cat", "dog"],
                   "image_shape": [3, 4, 4]}  # fmt: skip
    (tmp_path / "images" / METADATA_FILE).write_text(json.dumps(description))
    # data=sequences: a long table beside it, two sequences of each of two classes.
    rows = [f"s{n},{t},{'ab'[n % 2]},{t * n}.5,1" for n in range(4) for t in range(n + 2)]
    (tmp_path / "sequences.csv").write_text("\n".join(["id,time,label,x,y", *rows]) + "\n")
    return tmp_path / "images"


def with_data_path(overrides: list[str], folder) -> list[str]:
    """data=image_folder needs data.path (its class count is read from the folder),
    data=sequences a table beside it, and data=streaming data.input_dir (a prepared copy's
    description)."""
    if "data=sequences" in overrides:
        return [*overrides, f"data.path={folder.parent / 'sequences.csv'}"]
    if "data=streaming" in overrides:
        return [*overrides, f"data.input_dir={folder}"]
    return [*overrides, f"data.path={folder}"] if "data=image_folder" in overrides else overrides


def test_every_group_has_options() -> None:
    for group in GROUPS:
        assert options(group), f"configs/{group}/ has no options"
    # What the docs and configs name (a fork adds its own options to these).
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
    fill_in_from_data(cfg.data, datamodule)  # what only the data knows
    if data == "sequences" and "num_features" not in cfg.model.net:  # a net for images only
        with pytest.raises(UserError, match=r"reads images \(.* takes image_shape, not num_"):
            check_model_reads_data(cfg)
        return
    check_model_reads_data(cfg)
    module = instantiate(cfg.model, _convert_="all")
    assert isinstance(datamodule, SplitDataModule)
    assert isinstance(module, Classifier)
    if data == "sequences":  # features and classes are read from the table
        assert (cfg.model.net.num_features, cfg.model.net.num_classes) == (2, 2)
        logits = module(torch.randn(2, 5, 2), torch.tensor([5, 3]))
        assert logits.shape == (2, 2)
        return
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
    # The module passes the run's optimizer steps (trainer.estimated_stepping_batches).
    scheduler = instantiate(cfg.model.scheduler)(optimizer=optimizer, total_steps=100)
    assert isinstance(optimizer, torch.optim.Optimizer)
    assert scheduler.base_lrs == [cfg.model.optimizer.lr]  # the peak (a warmup starts lower)
    assert isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler)


def test_experiment_overrides_several_groups(compose_config) -> None:
    cfg = compose_config("experiment=example")
    assert cfg.model.net._target_ == "kindling.models.recurrent.LSTMClassifier"
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


def test_the_checkpoint_tested_may_be_the_last_epochs(compose_config) -> None:
    """`callbacks.model_checkpoint.monitor=null` tests the last epoch: Lightning refuses two
    ModelCheckpoints whose state keys (monitor, mode, intervals) are equal."""
    cfg = compose_config(
        "callbacks.model_checkpoint.monitor=null", "callbacks.step_checkpoint.every_n_train_steps=4"
    )
    callbacks = instantiate_group(cfg.callbacks, "callbacks")
    checkpoints = [callback for callback in callbacks if isinstance(callback, ModelCheckpoint)]
    assert len(checkpoints) == 3
    assert len({callback.state_key for callback in checkpoints}) == 3


def test_step_checkpoints_are_a_callback_only_when_their_interval_is_set(compose_config) -> None:
    """Lightning calls every callback's hooks at every step: one that would do nothing is not
    built."""
    for interval, expected in (("null", 2), ("0", 2), ("4", 3)):
        cfg = compose_config(f"callbacks.step_checkpoint.every_n_train_steps={interval}")
        callbacks = instantiate_group(cfg.callbacks, "callbacks")
        assert sum(isinstance(c, ModelCheckpoint) for c in callbacks) == expected, interval


def test_every_run_keeps_its_guarantees_whatever_its_callbacks(compose_config) -> None:
    """Exact resume and the checkpoint on interrupt are the run's, not the callbacks group's:
    `callbacks=none` keeps them, the interrupt's last but for checkpoints (it holds back a signal
    that other callbacks' validation hooks saw)."""
    from kindling.callbacks.interrupt import CheckpointOnInterrupt
    from kindling.callbacks.resume import ResumeExactly

    for callbacks in ("default", "none"):
        cfg = compose_config(f"callbacks={callbacks}", "interrupt.exit_within_s=7")
        trainer = kindling.train.build_trainer(cfg, {"run": "provenance"})
        # Of the callbacks build_trainer gives (Lightning puts checkpoint callbacks after all
        # others, and adds a progress bar and a summary where none is given).
        given = [c for c in trainer.callbacks if not isinstance(c, Checkpoint | ProgressBar)]
        resume, interrupt = [c for c in given if not isinstance(c, ModelSummary)][-2:]
        assert isinstance(resume, ResumeExactly) and isinstance(interrupt, CheckpointOnInterrupt)
        assert resume.config["seed"] == cfg.seed and resume.provenance == {"run": "provenance"}
        assert interrupt.exit_within_s == 7
    cfg = compose_config("interrupt=null")
    trainer = kindling.train.build_trainer(cfg, {})
    assert not any(isinstance(c, CheckpointOnInterrupt) for c in trainer.callbacks)


def test_callbacks_and_loggers_are_named_entries(compose_config) -> None:
    cfg = compose_config()
    assert set(cfg.callbacks) >= {
        "model_checkpoint",
        "rich_progress_bar",
        "rich_model_summary",
        "learning_rate_monitor",
        "stop_on_divergence",
    }
    assert cfg.callbacks.model_checkpoint.monitor == "val/loss"
    assert cfg.callbacks.last_checkpoint.filename == "last"
    assert "early_stopping" not in cfg.callbacks  # the whole schedule, then its last weights
    stopping = compose_config("callbacks=[default,early_stopping]").callbacks.early_stopping
    assert stopping.monitor == "val/loss"
    # One key moves every checkpoint, e.g. to object storage.
    moved = compose_config("callbacks.model_checkpoint.dirpath=memory://bucket/checkpoints")
    assert {moved.callbacks[name].dirpath for name in ("last_checkpoint", "step_checkpoint")} == {
        "memory://bucket/checkpoints"
    }
    assert set(cfg.logger) == {"csv"}
    assert not compose_config("callbacks=none").callbacks
    assert not compose_config("logger=none").logger


def test_top_level_keys(compose_config) -> None:
    cfg = compose_config("seed=0")
    assert cfg.seed == 0
    for key in ["train", "test", "ckpt_path", "task_name", "tags", "optimized_metric"]:
        assert key in cfg
    assert cfg.trainer.accelerator == "auto" and cfg.trainer.devices == 1


# The Trainer arguments users reach for, each listed in configs/trainer/default.yaml so that
# `trainer.max_steps=2000` needs no `+`.
COMMON_TRAINER_KEYS = [
    "max_epochs", "min_epochs", "max_steps", "min_steps", "max_time", "val_check_interval",
    "check_val_every_n_epoch", "num_sanity_val_steps", "limit_train_batches",
    "limit_val_batches", "limit_test_batches", "limit_predict_batches", "overfit_batches",
    "fast_dev_run", "accumulate_grad_batches", "gradient_clip_val", "gradient_clip_algorithm",
    "enable_progress_bar", "enable_model_summary", "enable_checkpointing", "profiler",
    "detect_anomaly", "deterministic", "benchmark",
]  # fmt: skip


def test_common_trainer_arguments_are_listed_with_lightnings_defaults(compose_config) -> None:
    trainer = compose_config().trainer
    assert set(COMMON_TRAINER_KEYS) <= set(trainer)
    # A Lightning default of None stands for a value that the yaml spells out.
    spelled_out = {
        **{f"limit_{split}_batches": 1.0 for split in ["train", "val", "test", "predict"]},
        **{f"enable_{part}": True for part in ["progress_bar", "model_summary", "checkpointing"]},
        "num_sanity_val_steps": 2,
    }
    kindling_defaults = {"max_epochs", "min_epochs", "deterministic", "benchmark"}
    for name, parameter in inspect.signature(L.Trainer).parameters.items():
        if name in COMMON_TRAINER_KEYS and name not in kindling_defaults:
            assert trainer[name] == spelled_out.get(name, parameter.default), name
    cfg = compose_config("trainer.max_steps=2000", "trainer.gradient_clip_val=1.0")
    assert cfg.trainer.max_steps == 2000 and cfg.trainer.gradient_clip_val == 1.0


def test_value_check_passes_every_null_the_trainer_takes(compose_config) -> None:
    optional = [
        name for name, parameter in inspect.signature(L.Trainer).parameters.items()
        # max_epochs is also the cosine schedule's length, which null would break.
        if name in COMMON_TRAINER_KEYS and name != "max_epochs"
        and type(None) in typing.get_args(parameter.annotation)
    ]  # fmt: skip
    assert "check_val_every_n_epoch" in optional and len(optional) > 10
    kindling.train._check(compose_config(*[f"trainer.{name}=null" for name in optional]))
    step_based = ["trainer.max_steps=2000", "trainer.max_epochs=-1"]
    step_based += ["trainer.val_check_interval=250", "trainer.check_val_every_n_epoch=null"]
    kindling.train._check(compose_config(*step_based))


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "trainer.max_epochs=abc",
            "trainer.max_epochs=abc has the wrong type: lightning.pytorch.Trainer takes "
            "max_epochs: Optional[int]. Change trainer.max_epochs.",
        ),
        ("trainer.enable_progress_bar=maybe", "enable_progress_bar: Optional[bool]"),
        (
            "model.optimizer.lr=fast",
            "model.optimizer.lr=fast has the wrong type: torch.optim.AdamW takes lr: float",
        ),
        ("data.batch_size=big", "data.batch_size=big has the wrong type"),
        ("seed=abc", "seed must be a whole number or null, got abc"),
        ("data.batch_size=null", "data.batch_size=null has the wrong type"),
        ("model.net.image_shape=[1,8]", None),
    ],
)
def test_value_check_refuses_what_the_target_cannot_take(compose_config, override, message):
    if message is None:  # a value of the declared type: the target itself judges it
        kindling.train._check(compose_config(override))
        return
    with pytest.raises(UserError, match=re.escape(message)):  # the model's: once data is built
        kindling.train.train_and_test(compose_config(override))


@pytest.mark.slow
def test_validation_every_n_steps_across_epochs(compose_config) -> None:
    cfg = compose_config(
        "trainer=cpu", "trainer.max_steps=20", "trainer.max_epochs=-1",
        "trainer.val_check_interval=5", "trainer.check_val_every_n_epoch=null",
        # 8 steps per epoch: validation falls in the middle of epochs, and in three of them.
        "trainer.limit_train_batches=8", "trainer.limit_val_batches=2", "data.batch_size=16",
        "model.scheduler=null", "test=false", "callbacks.plots=null", *QUIET,
    )  # fmt: skip
    run(cfg)
    with open(Path(cfg.paths.output_dir) / "csv" / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["val/loss"]]
    # A validation is logged with the (0-based) index of the training step it follows.
    steps_done = [int(r["step"]) + 1 for r in rows]
    assert steps_done == [5, 10, 15, 20]
    assert [int(r["epoch"]) for r in rows] == [0, 1, 1, 2]


def test_trainer_switches_turn_off_their_callbacks(compose_config, monkeypatch) -> None:
    # Lightning refuses a progress bar or checkpoint callback beside these false, and would run
    # the model summary callback anyway.
    built = []

    def recording_build(config, key, **kwargs):
        built.append(build(config, key, **kwargs))
        return built[-1]

    monkeypatch.setattr(kindling.train, "build", recording_build)
    switches = ["enable_progress_bar", "enable_model_summary", "enable_checkpointing"]
    run(compose_config("debug=fdr", *[f"trainer.{name}=false" for name in switches]))
    (trainer,) = [b for b in built if isinstance(b, L.Trainer)]
    assert not [c for c in trainer.callbacks if isinstance(c, ProgressBar | ModelSummary)]
    assert trainer.checkpoint_callback is None


@pytest.mark.parametrize(("group", "option"), [
    (group, option) for group in ("optimizer", "scheduler") for option in options(f"model/{group}")
])  # fmt: skip
def test_every_optimizer_and_scheduler_trains_a_step(compose_config, group, option) -> None:
    """configs/model/optimizer/ and configs/model/scheduler/ serve every model as
    `model.<group>`, chosen with `model/<group>=<option>`."""
    cfg = compose_config(f"model/{group}={option}", "debug=fdr", *QUIET)
    chosen = OmegaConf.load(CONFIG_DIR / "model" / group / f"{option}.yaml")
    assert cfg.model[group]._target_ == chosen._target_
    run(cfg)


def test_help_lists_every_option_of_every_group() -> None:
    """`python train.py --help` lists each config folder's yaml files (Hydra lists them), so a
    new model or data set is listed as soon as its file exists."""
    shown = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "--help"], capture_output=True, text=True
    ).stdout
    listed = dict(line.split(": ", 1) for line in shown.splitlines() if ": " in line)
    for folder in [p for p in CONFIG_DIR.rglob("*") if p.is_dir() and p.parts[-1] != "hydra"]:
        group = str(folder.relative_to(CONFIG_DIR))
        if group.startswith(("hydra", "local")) or not options(group):
            continue
        assert listed.get(group, "").split(", ") == options(group), group


# train.py as `python train.py <args>` runs it, then which libraries the process loaded.
_LOADED_AFTER_TRAIN_PY = """
import runpy, sys
sys.argv = [sys.argv[1], *sys.argv[2:]]
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
except SystemExit:
    pass
print("loaded:", *sorted({"torch", "lightning"} & set(sys.modules)))
"""


@pytest.mark.parametrize(
    ("args", "shows"),
    [
        (["--help"], "== Groups =="),
        (["model=lstm", "--cfg", "job"], "LSTMClassifier"),
        (["--info", "defaults"], "model/cnn"),
        (["-sc", "query=bash"], "trainer.max_epochs="),
    ],
)
def test_help_config_and_completion_answer_without_torch(args, shows) -> None:
    """Composing a config for the user to read or complete imports neither torch nor
    Lightning (seconds of imports before every answer, each press of TAB included)."""
    env = {**os.environ, "COMP_LINE": "python train.py trainer.max_"}
    result = subprocess.run(
        [sys.executable, "-c", _LOADED_AFTER_TRAIN_PY, str(ROOT / "train.py"), *args],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert shows in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stdout.rstrip().endswith("loaded:"), result.stdout[-300:]


def test_a_multiruns_launching_process_imports_no_torch() -> None:
    """What the process that launches a multirun loads (its callback and report, the sweeper and
    launcher plugins) imports neither torch nor Lightning: submitting a SLURM or joblib sweep
    costs no seconds of imports; its jobs import them."""
    modules = [
        "kindling.run.job_record", "kindling.report", "kindling.optuna_sweep",
        "hydra_plugins.kindling_optuna_sweeper.optuna_sweeper",
        "hydra_plugins.kindling_slurm_launcher.slurm_launcher",
    ]  # fmt: skip
    loaded = "print('loaded:', *{'torch', 'lightning'} & set(sys.modules))"
    code = f"import sys, {', '.join(modules)}; {loaded}"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.stdout.strip() == "loaded:", result.stdout + result.stderr[-2000:]
