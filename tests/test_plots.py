"""Learning curves and the test confusion matrix, written as PNGs into the run folder."""

from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kindling.callbacks import plots
from kindling.train import run

from helpers import QUIET, read_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def assert_png(path: Path, min_side: int = 200) -> None:
    assert path.read_bytes()[:8] == PNG_MAGIC, f"{path} is not a PNG"
    with Image.open(path) as image:
        image.load()  # decodes the whole file: a truncated PNG fails here
        width, height = image.size
    assert width > min_side and height > min_side, (width, height)


@pytest.fixture
def drawn(monkeypatch) -> dict:
    """What the callback drew: the arguments and figures of the two plotting functions."""
    calls = {}

    def spy(name, function):
        def wrapper(*args, **kwargs):
            figure = function(*args, **kwargs)
            calls[name] = (args, figure)
            return figure

        return wrapper

    monkeypatch.setattr(
        plots, "learning_curves_figure", spy("curves", plots.learning_curves_figure)
    )
    monkeypatch.setattr(
        plots, "confusion_matrix_figure", spy("confmat", plots.confusion_matrix_figure)
    )
    return calls


def test_run_writes_learning_curves_and_confusion_matrix(compose_config, tmp_path, drawn) -> None:
    cfg = compose_config("debug=limit", "trainer=cpu", "logger=[csv,tensorboard]", *QUIET)
    run(cfg)
    run_dir = tmp_path / "run"
    assert_png(run_dir / "learning_curves.png")
    assert_png(run_dir / "confusion_matrix.png")

    # One point per epoch in both panels, train and val, at the epochs metrics.csv has.
    rows = read_metrics(run_dir)
    epochs = sorted({int(r["epoch"]) for r in rows if r.get("val/acc")})
    assert epochs == [0, 1, 2]  # debug=limit: 3 epochs
    _, curves = drawn["curves"]
    assert [ax.get_title() for ax in curves.axes] == ["loss", "acc"]
    for ax in curves.axes:
        assert [line.get_label() for line in ax.lines] == ["train", "val"]
        for line in ax.lines:
            assert list(line.get_xdata()) == epochs
    val_acc = [float(r["val/acc"]) for r in rows if r.get("val/acc")]
    np.testing.assert_allclose(curves.axes[1].lines[1].get_ydata(), val_acc, rtol=1e-6)
    # Train values belong to their own epoch (modules log them after this callback's hook).
    train_loss = [float(r["train/loss"]) for r in rows if r.get("train/loss")]
    np.testing.assert_allclose(curves.axes[0].lines[0].get_ydata(), train_loss, rtol=1e-6)

    # The matrix counts every test sample once, and its diagonal is the logged test accuracy.
    (confmat,), _ = drawn["confmat"]
    counts = np.loadtxt(run_dir / "confusion_matrix.csv", delimiter=",")
    np.testing.assert_array_equal(counts, confmat.numpy())
    assert counts.sum() == cfg.trainer.limit_test_batches * cfg.data.batch_size
    test_acc = float([r["test/acc"] for r in rows if r.get("test/acc")][-1])
    assert np.trace(counts) / counts.sum() == pytest.approx(test_acc)

    images = set()
    for event_file in (run_dir / "tensorboard").glob("events.out.tfevents.*"):
        images |= set(EventAccumulator(str(event_file)).Reload().Tags()["images"])
    assert {"plots/learning_curves", "plots/confusion_matrix"} <= images


def test_language_model_run_skips_what_it_does_not_log(compose_config, tmp_path, drawn) -> None:
    # A recurrent net on short windows, without text samples: seconds on a CPU.
    small = [
        "model=lm/rnn", "model.net.hidden_size=32", "model.net.num_layers=1",
        "model.sample_length=0",
        "data.batch_size=8", "data.context_length=16",
    ]  # fmt: skip
    run(compose_config("experiment=charlm", "debug=limit", "trainer=cpu", *small, *QUIET))
    run_dir = tmp_path / "run"
    assert_png(run_dir / "learning_curves.png")
    _, curves = drawn["curves"]
    # No accuracy panel; perplexity is logged for validation only.
    assert [ax.get_title() for ax in curves.axes] == ["loss", "ppl"]
    assert [line.get_label() for line in curves.axes[1].lines] == ["val"]
    # Next-token prediction has no class count: no confusion matrix.
    assert "confmat" not in drawn
    assert not (run_dir / "confusion_matrix.png").exists()


def test_nothing_logged_draws_nothing() -> None:
    assert plots.learning_curves_figure({}, ["loss", "acc"]) is None


@pytest.mark.slow
def test_confusion_matrix_counts_the_samples_of_every_rank(two_process_run) -> None:
    """Two CPU processes, each testing 2 batches of 32: the matrix must hold all 128."""
    (run_dir,) = (two_process_run.cwd / "logs" / "debug" / "runs").iterdir()
    counts = np.loadtxt(run_dir / "confusion_matrix.csv", delimiter=",")
    assert counts.sum() == 2 * 2 * 32
    rows = read_metrics(run_dir)
    test_acc = float([r["test/acc"] for r in rows if r.get("test/acc")][-1])
    assert np.trace(counts) / counts.sum() == pytest.approx(test_acc)
    assert_png(run_dir / "confusion_matrix.png")
