"""The whole path of a run: config -> fit -> test, in-process and through `python train.py`."""

import os
from pathlib import Path

import numpy as np
import pytest
import torch

from kindling.callbacks.divergence import DivergenceError
from kindling.errors import UserError
from kindling.train import run, train_and_test

from helpers import QUIET, compose_in, last_value, options, read_metrics, train_py_here


@pytest.mark.parametrize("model", options("model"))
def test_fast_dev_run_every_model(compose_config, model: str) -> None:
    cfg = compose_config(f"model={model}", "debug=fdr", *QUIET)
    value = run(cfg)
    # fast_dev_run validates one batch: the best accuracy is that batch's share of hits.
    batch_size = cfg.data.batch_size
    assert value * batch_size == pytest.approx(round(value * batch_size))
    assert 0.0 <= value <= 1.0


def test_seed_zero_is_a_seed(compose_config, monkeypatch) -> None:
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)  # left by an earlier run in this process
    run(compose_config("debug=fdr", "seed=0", *QUIET))
    assert os.environ["PL_GLOBAL_SEED"] == "0"


# The fewest of the default 10 epochs in which each model clears 0.9 with room (its val/acc then,
# on the CPU): cnn 0.986, rnn 0.944, temporal_conv 0.986, gru 0.951, lstm 0.938, timm 0.938. The
# Transformer takes all 10 (0.91 after 8).
DIGITS_EPOCHS = {"cnn": 3, "rnn": 3, "temporal_conv": 3, "gru": 4, "lstm": 6, "timm": 6}


@pytest.mark.slow
@pytest.mark.parametrize("model", options("model"))
def test_every_model_learns_digits(compose_config, tmp_path: Path, model: str) -> None:
    """An honest learning test: real data, the default config but for its epochs (a timm net
    for tests in place of model=timm's ResNet-18, whose 11 M parameters cost a minute)."""
    tiny = ["model.net.name=test_resnet"] if model == "timm" else []
    epochs = f"trainer.max_epochs={DIGITS_EPOCHS.get(model, 10)}"
    cfg = compose_config(f"model={model}", *tiny, "trainer=cpu", epochs, "test=false", *QUIET)
    best = run(cfg)
    rows = read_metrics(tmp_path / "run")
    assert last_value(rows, "val/acc") >= 0.90
    assert best == pytest.approx(max(float(r["val/acc"]) for r in rows if r["val/acc"]))
    # The loss fell: the last epoch is far below the first.
    train_losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert train_losses[-1] < 0.5 * train_losses[0]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_timm_net_learns_digits_on_the_gpu(compose_config, tmp_path: Path) -> None:
    cfg = compose_config("model=timm", "model.net.name=test_resnet", "trainer=gpu",
                         "trainer.max_epochs=3", "test=false", *QUIET)  # fmt: skip
    run(cfg)
    rows = read_metrics(tmp_path / "run")
    assert last_value(rows, "val/acc") >= 0.5  # ten classes: chance is 0.1
    train_losses = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    assert train_losses[-1] < 0.5 * train_losses[0]


def test_run_logs_metrics_checkpoints_and_returns_optimized_metric(trained_run) -> None:
    value, run_dir = trained_run.value, trained_run.run_dir
    rows = read_metrics(run_dir)
    logged = {name for row in rows for name, v in row.items() if v}
    assert {
        "train/loss",
        "train/acc",
        "val/loss",
        "val/acc",
        "val/acc_best",
        "test/loss",
        "test/acc",
    } <= logged
    assert value == pytest.approx(last_value(rows, "val/acc_best"))
    checkpoints = {p.name for p in (run_dir / "checkpoints").iterdir()}
    assert "last.ckpt" in checkpoints and len(checkpoints) == 2  # last + best


def test_unlogged_optimized_metric_is_a_clear_error(compose_config) -> None:
    with pytest.raises(UserError, match="optimized_metric='val/f1' was not logged"):
        train_and_test(compose_config("debug=fdr", "optimized_metric=val/f1", *QUIET))


def test_bad_input_exits_with_its_message_alone(compose_config, caplog) -> None:
    with pytest.raises(SystemExit) as exit_info:
        run(compose_config("debug=fdr", "data.batch_size=0", *QUIET))
    assert exit_info.value.code == 1
    assert "data.batch_size must be a positive integer, got 0" in caplog.text


def test_diverging_loss_stops_the_run_naming_the_step(compose_config) -> None:
    cfg = compose_config("trainer=cpu", "debug=limit", "model.optimizer.lr=1e12", *QUIET)
    with pytest.raises(DivergenceError, match=r"NaN or inf at step \d+"):
        train_and_test(cfg)


@pytest.mark.slow
def test_train_py_default_run_leaves_one_run_folder(tmp_path: Path) -> None:
    result = train_py_here("trainer.max_epochs=1", *QUIET, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (run_dir,) = (tmp_path / "logs" / "train" / "runs").iterdir()
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    rows = read_metrics(run_dir)
    assert last_value(rows, "test/acc") > 0.5
    assert f"Run folder: {run_dir}" in result.stdout + result.stderr


@pytest.mark.slow
def test_train_py_multirun_one_folder_per_model(tmp_path: Path) -> None:
    models = ["-m", "model=cnn,rnn,lstm,transformer", "debug=fdr", "callbacks.plots=null"]
    result = train_py_here(*models, *QUIET, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    (sweep_dir,) = (tmp_path / "logs" / "debug" / "multiruns").iterdir()
    jobs = sorted(p.name for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit())
    assert jobs == ["0", "1", "2", "3"]
    targets = [(sweep_dir / j / ".hydra" / "config.yaml").read_text() for j in jobs]
    modules = ["cnn.CNN", "recurrent.RNN", "recurrent.LSTM", "transformer.Transformer"]
    for target, cls in zip(targets, modules, strict=True):
        assert f"kindling.models.{cls}Classifier" in target


@pytest.mark.slow
def test_train_py_two_cpu_processes(two_process_run) -> None:
    (run_dir,) = (two_process_run.cwd / "logs" / "debug" / "runs").iterdir()
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    assert "Starting with 2 processes" in two_process_run.output
    rows = read_metrics(run_dir)
    # Each epoch's metrics are written once (rank 0's logger), not once per process.
    for name in ("train/acc", "val/acc", "test/acc"):
        assert len([row for row in rows if row[name]]) == (1 if name == "test/acc" else 3), name
    # The test accuracy is reduced over both processes: debug=limit tests 2 batches on each,
    # of 32 images (the global batch of 64 split in two), and the confusion matrix counts them.
    counts = np.loadtxt(run_dir / "confusion_matrix.csv", delimiter=",")
    test_acc = last_value(rows, "test/acc")
    assert counts.sum() == 2 * 2 * 32
    assert test_acc == pytest.approx(np.trace(counts) / counts.sum())
    # And the two processes trained one model: 15 steps take 10 classes well above chance (0.1;
    # one process reaches about 0.7 in as many steps).
    assert test_acc > 0.4


def test_checkpoint_alone_rebuilds_the_model(compose_config, tmp_path) -> None:
    import torch

    from kindling.loading import load_module
    from kindling.modules.classifier import Classifier

    # Not the default net: rebuilding the default instead would not load these weights.
    run(compose_config("model=lstm", "debug=limit", "trainer=cpu", "trainer.max_epochs=1", *QUIET))
    path = tmp_path / "run" / "checkpoints" / "last.ckpt"
    module, checkpoint = load_module(path)
    assert isinstance(module, Classifier) and not module.training
    assert (
        checkpoint["config"]["model"]["net"]["_target_"]
        == "kindling.models.recurrent.LSTMClassifier"
    )
    weights = torch.load(path, weights_only=True)["state_dict"]
    for name, tensor in module.state_dict().items():
        torch.testing.assert_close(tensor, weights[name])


def test_throughput_callback_logs_samples_per_second_and_counts_flops(
    compose_config, monkeypatch
) -> None:
    from hydra.utils import instantiate
    from lightning.pytorch.callbacks import throughput_monitor

    from kindling.callbacks.throughput import count_flops
    from kindling.models.cnn import CNNClassifier
    from kindling.modules.classifier import Classifier

    # A device of Lightning's table with a peak of 1 TFLOP/s (a CPU has none).
    monkeypatch.setattr(throughput_monitor, "get_available_flops", lambda device, dtype: 10**12)
    cfg = compose_config("callbacks=[default,throughput]", "callbacks.throughput.window_size=2",
                         "debug=limit", "trainer=cpu", "trainer.log_every_n_steps=1",
                         *QUIET)  # fmt: skip
    run(cfg)
    rows = read_metrics(Path(cfg.paths.output_dir))
    # Rates over the same window of steps: each batch counts its samples and its FLOPs.
    batches_per_sec = last_value(rows, "train/device/batches_per_sec")
    samples_per_sec = last_value(rows, "train/device/samples_per_sec")
    assert samples_per_sec == pytest.approx(cfg.data.batch_size * batches_per_sec)
    batch = torch.zeros(cfg.data.batch_size, *cfg.data.image_shape), torch.zeros(16)
    flops_per_batch = count_flops(instantiate(cfg.model, _convert_="all"), batch)
    flops_per_sec = last_value(rows, "train/device/flops_per_sec")
    assert flops_per_sec == pytest.approx(flops_per_batch * batches_per_sec)
    mfu = last_value(rows, "train/device/mfu")
    assert mfu == pytest.approx(flops_per_sec / 1e12)  # over the device's peak
    assert 0 < mfu < 1  # a CPU against a made-up 1 TFLOP/s peak
    # A product of k terms is 2k FLOPs forward; backward is twice that, less the gradient of
    # the input image, which nothing needs.
    module = Classifier(CNNClassifier((1, 8, 8), 10, channels=[4]), 10, optimizer=None)
    flops = count_flops(module, (torch.zeros(16, 1, 8, 8), torch.zeros(16)))
    first_conv, second_conv = 16 * 2 * 8 * 8 * 4 * 9 * 1, 16 * 2 * 8 * 8 * 4 * 9 * 4
    head = 16 * 2 * 4 * 10
    assert flops == 3 * (first_conv + second_conv + head) - first_conv


@pytest.mark.parametrize(
    ("card", "peak"),
    [
        ("NVIDIA H200", 989.5e12),  # Lightning's table names no H200 this way
        ("NVIDIA L40S", 362.05e12),  # Lightning's takes it for an L4 (121e12)
        ("NVIDIA H100 80GB HBM3", 989.4e12),  # an H100 SXM: Lightning's answer
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA Unknown Card", None),
    ],
)
def test_throughput_callback_takes_the_peak_of_a_card_lightning_misses(
    monkeypatch, caplog, card: str, peak: float | None
) -> None:
    from types import SimpleNamespace

    from lightning.pytorch.plugins import MixedPrecision
    from lightning.pytorch.trainer.states import RunningStage

    from kindling.callbacks.throughput import ThroughputWithMFU

    # A bf16 run on one pretend GPU of this name: what the monitor reads when it is set up.
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: card)
    trainer = SimpleNamespace(
        precision="bf16-mixed",
        precision_plugin=MixedPrecision("bf16-mixed", "cuda"),
        strategy=SimpleNamespace(root_device=torch.device("cuda", 0)),
        state=SimpleNamespace(stage=RunningStage.TRAINING),
        enable_validation=False,
        world_size=1,
    )
    monitor = ThroughputWithMFU(window_size=2)
    with caplog.at_level("INFO"):
        monitor.setup(trainer, None, "fit")
    meter = monitor._throughputs[RunningStage.TRAINING]  # what the batch hooks update
    for step in (1, 2):
        meter.update(time=float(step), batches=step, samples=16 * step, flops=10**12)
    metrics = meter.compute()
    assert metrics["device/samples_per_sec"] == 16
    if peak is None:
        assert "device/mfu" not in metrics
        assert "Peak FLOPs of this device unknown: MFU is not logged." in caplog.text
    else:
        assert monitor.available_flops == pytest.approx(peak)
        assert metrics["device/mfu"] == pytest.approx(1e12 / peak)


@pytest.mark.parametrize("model", ["cnn", "transformer"])
def test_model_summary_shows_flops_and_sizes_of_one_example_image(compose_config, model) -> None:
    from hydra.utils import instantiate
    from lightning.pytorch.utilities.model_summary import ModelSummary
    from torch.utils.flop_counter import FlopCounterMode

    cfg = compose_config(f"model={model}")
    module = instantiate(cfg.model, _convert_="all")
    image_shape = list(cfg.data.image_shape)
    summary = ModelSummary(module, max_depth=1)

    module.net.eval()
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        module.net(torch.zeros(1, *image_shape))
    assert summary.total_flops == counter.get_total_flops() > 0
    assert summary.in_sizes[summary.layer_names.index("net")] == [1, *image_shape]
    assert summary.out_sizes[summary.layer_names.index("net")] == [1, cfg.data.num_classes]

    # A compiled net would compile once more for the example: no example, no FLOPs.
    compiled = instantiate(compose_config(f"model={model}", "model.compile=true").model)
    assert compiled.example_input_array is None
    assert ModelSummary(compiled, max_depth=1).total_flops == 0


EARLY_STOPPING = ["callbacks=[default,early_stopping]", "callbacks.early_stopping.patience=1"]


@pytest.mark.parametrize(
    ("stopping", "tested"),
    [([], "last.ckpt"), ([*EARLY_STOPPING, "callbacks.early_stopping.mode=max"], "epoch_000.ckpt")],
    ids=["whole schedule", "stopped early"],
)
def test_a_run_tests_the_weights_it_ended_with_or_where_early_stopping_ended_it_its_best(
    tmp_path: Path, stopping: list[str], tested: str
) -> None:
    """A validation split of a few samples cannot choose an epoch: a run tests the end of its
    schedule. Here the best checkpoint is the first epoch's (val/loss chosen at its highest)."""
    common = ["trainer=cpu", "debug=limit", "trainer.max_epochs=3", "optimized_metric=null"]
    common += ["callbacks.model_checkpoint.mode=max", *QUIET]
    run(compose_in(tmp_path / "fit", *common, *stopping))
    checkpoint = tmp_path / "fit" / "run" / "checkpoints" / tested
    run(compose_in(tmp_path / "again", *common, "train=false", f"ckpt_path={checkpoint}"))
    test_loss = [
        last_value(read_metrics(tmp_path / f / "run"), "test/loss") for f in ("fit", "again")
    ]
    assert test_loss[0] == pytest.approx(test_loss[1], rel=1e-6)


def test_a_run_that_stops_before_its_first_validation_still_finishes(compose_config) -> None:
    # Early stopping checks after each validation; at the end of a training epoch it would find
    # no val/acc yet and raise.
    cfg = compose_config("trainer=cpu", "trainer.max_steps=3", "optimized_metric=null", *QUIET)
    assert run(cfg) is None
    rows = read_metrics(Path(cfg.paths.output_dir))
    assert not any(row.get("val/acc") for row in rows)
    # Tested once, on the whole test split of 359 images: a count of hits over 359.
    (test_acc,) = [float(row["test/acc"]) for row in rows if row.get("test/acc")]
    assert test_acc * 359 == pytest.approx(round(test_acc * 359))
    assert (Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt").is_file()
