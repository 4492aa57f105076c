"""A run resumed in its folder keeps its record: every epoch's metrics, its first config."""

import csv
import logging
from pathlib import Path

import pytest
import torch

from kindling.callbacks.plots import read_history
from kindling.loggers import ResumableCSVLogger
from kindling.train import run

from conftest import QUIET, TRAINED_RUN, copy_run

# What a finished run's folder records: a refused resume changes none of it.
RECORD = ["results.yaml", "csv/metrics.csv", "checkpoints/last.ckpt"]


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def epochs_with(rows: list[dict[str, str]], name: str) -> list[int]:
    return [int(row["epoch"]) for row in rows if row.get(name)]


def write_rows(logger: ResumableCSVLogger, rows: list[tuple[int, int, dict[str, float]]]) -> None:
    for epoch, step, metrics in rows:
        logger.log_metrics({**metrics, "epoch": epoch}, step=step)
    logger.save()


def test_a_resumed_run_keeps_the_rows_its_checkpoint_covers(tmp_path: Path) -> None:
    """Killed in epoch 2 after a checkpoint at the end of epoch 1 (step 10): epoch 2's partial
    rows go, since the resumed run logs that epoch again; no epoch is missing or doubled."""
    first = ResumableCSVLogger(tmp_path, name="csv", version="")
    first.log_hyperparams({"lr": 0.1})
    write_rows(first, [(0, 5, {"val/loss": 2.0}), (0, 5, {"train/loss": 2.5})])
    first.log_metrics({"lr-AdamW": 0.1}, step=5)  # LearningRateMonitor's rows have no epoch
    write_rows(first, [(1, 10, {"val/loss": 1.5}), (1, 10, {"train/loss": 1.8})])
    first.log_metrics({"lr-AdamW": 0.05}, step=10)  # epoch 2 starts after the checkpoint
    write_rows(first, [(2, 12, {"train/loss_step": 1.7}), (2, 10, {"test/loss": 1.6})])

    resumed = ResumableCSVLogger(tmp_path, name="csv", version="")
    resumed.log_hyperparams({"lr": 0.2})
    resumed.continue_after(epoch=1, step=10)
    resumed.log_metrics({"lr-AdamW": 0.05}, step=10)
    write_rows(resumed, [(2, 15, {"val/loss": 1.2, "val/acc": 0.7}), (2, 15, {"train/loss": 1.4})])

    rows = read_rows(tmp_path / "csv" / "metrics.csv")
    assert epochs_with(rows, "val/loss") == [0, 1, 2]
    assert epochs_with(rows, "train/loss") == [0, 1, 2]
    assert epochs_with(rows, "train/loss_step") == []  # logged after the checkpoint: redone
    assert [row["lr-AdamW"] for row in rows if row["lr-AdamW"]] == ["0.1", "0.05"]
    assert epochs_with(rows, "test/loss") == [2]  # the test of the first part stays
    assert epochs_with(rows, "val/acc") == [2]  # a key new to the file: the header grows
    assert read_history(tmp_path / "csv" / "metrics.csv")["val/loss"] == {0: 2.0, 1: 1.5, 2: 1.2}
    # The first run's hparams stay; the resumed run's are beside them.
    assert "lr: 0.1" in (tmp_path / "csv" / "hparams.yaml").read_text()
    assert "lr: 0.2" in (tmp_path / "csv" / "hparams_resumed_1.yaml").read_text()


def test_a_new_run_in_a_used_folder_replaces_its_metrics(tmp_path: Path) -> None:
    write_rows(ResumableCSVLogger(tmp_path, name="csv", version=""), [(0, 5, {"val/loss": 2.0})])
    write_rows(ResumableCSVLogger(tmp_path, name="csv", version=""), [(0, 4, {"val/loss": 1.0})])
    assert [row["val/loss"] for row in read_rows(tmp_path / "csv" / "metrics.csv")] == ["1.0"]


@pytest.mark.slow
def test_resume_in_the_same_folder_keeps_every_epoch(compose_config, tmp_path: Path) -> None:
    """2 epochs, then resume to 4: the metrics, the curves and the first config cover the run."""
    common = ["trainer=cpu", "debug=limit", "test=false", *QUIET]
    run_dir = tmp_path / "run"
    run(compose_config(*common, "trainer.max_epochs=2"))
    (run_dir / ".hydra").mkdir()  # as `python train.py` leaves it: a run folder to continue in
    first_tree = (run_dir / "config_tree.log").read_text()
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    run(compose_config(*common, "trainer.max_epochs=4", f"ckpt_path={checkpoint}"))

    rows = read_rows(run_dir / "csv" / "metrics.csv")
    assert epochs_with(rows, "val/loss") == [0, 1, 2, 3]
    assert epochs_with(rows, "train/loss") == [0, 1, 2, 3]
    history = read_history(run_dir / "csv" / "metrics.csv")  # what the learning curves plot
    assert sorted(history["val/loss"]) == sorted(history["train/acc"]) == [0, 1, 2, 3]
    # The curves of a run without a CSV file come from the checkpoint.
    plots = torch.load(checkpoint, weights_only=True)["callbacks"]["RunPlots"]["history"]
    assert sorted(plots["val/loss"]) == [0, 1, 2, 3]
    # The first run's record stays; the resumed run's is beside it.
    assert (run_dir / "config_tree.log").read_text() == first_tree
    (resumed,) = (run_dir / ".hydra").glob("resumed_*")
    assert "max_epochs: 4" in (resumed / "config_tree.log").read_text()
    assert (resumed / "provenance.yaml").is_file()
    assert (run_dir / "csv" / "hparams_resumed_1.yaml").is_file()


def test_resuming_a_finished_run_says_so_and_leaves_its_record(
    compose_config, trained_run, tmp_path: Path, caplog
) -> None:
    """The run trained its 4 epochs and was tested: resuming it with the same max_epochs would
    only test again, so it is refused in one line that says how to train further."""
    run_dir = copy_run(trained_run, tmp_path / "run")
    record = {name: (run_dir / name).read_bytes() for name in RECORD}
    with pytest.raises(SystemExit) as stopped:
        run(compose_config(*TRAINED_RUN, f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}"))
    assert stopped.value.code == 1
    (line,) = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert "has finished training: its checkpoint has 4 epochs of trainer.max_epochs=4" in line
    assert "trainer.max_epochs=8" in line  # how to train further
    # How to test it again: a test-only run of its best checkpoint, in a folder of its own.
    assert (
        f"train=false ckpt_path={run_dir / 'checkpoints' / trained_run.best_checkpoint.name}"
        in line
    )
    assert {name: (run_dir / name).read_bytes() for name in RECORD} == record
    assert not list(run_dir.glob("csv/hparams_resumed_*"))
