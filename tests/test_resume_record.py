"""A run resumed in its folder keeps its record: every epoch's metrics, its first config."""

import csv
import multiprocessing
import os
import random
import signal
import threading
from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from omegaconf import DictConfig

from kindling.checkpoints import AtomicCheckpointIO
from kindling.loggers.resumable_csv import ResumableCSVLogger
from kindling.train import run

from helpers import QUIET, TRAINED_RUN, copy_run, error_lines, read_csv

# What a finished run's folder records: a refused resume changes none of it.
RECORD = ["results.yaml", "csv/metrics.csv", "checkpoints/last.ckpt"]


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

    rows = read_csv(tmp_path / "csv" / "metrics.csv")
    assert epochs_with(rows, "val/loss") == [0, 1, 2]
    assert epochs_with(rows, "train/loss") == [0, 1, 2]
    assert epochs_with(rows, "train/loss_step") == []  # logged after the checkpoint: redone
    assert [row["lr-AdamW"] for row in rows if row["lr-AdamW"]] == ["0.1", "0.05"]
    assert epochs_with(rows, "test/loss") == [2]  # the test of the first part stays
    assert epochs_with(rows, "val/acc") == [2]  # a key new to the file: the header grows
    val_loss = {row["epoch"]: row["val/loss"] for row in rows if row["val/loss"]}
    assert val_loss == {"0": "2.0", "1": "1.5", "2": "1.2"}
    # The first run's hparams stay; the resumed run's are beside them.
    assert "lr: 0.1" in (tmp_path / "csv" / "hparams.yaml").read_text()
    assert "lr: 0.2" in (tmp_path / "csv" / "hparams_resumed_1.yaml").read_text()


def test_a_new_run_in_a_used_folder_replaces_its_metrics(tmp_path: Path) -> None:
    write_rows(ResumableCSVLogger(tmp_path, name="csv", version=""), [(0, 5, {"val/loss": 2.0})])
    write_rows(ResumableCSVLogger(tmp_path, name="csv", version=""), [(0, 4, {"val/loss": 1.0})])
    assert [row["val/loss"] for row in read_csv(tmp_path / "csv" / "metrics.csv")] == ["1.0"]


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

    rows = read_csv(run_dir / "csv" / "metrics.csv")
    assert epochs_with(rows, "val/loss") == [0, 1, 2, 3]
    assert epochs_with(rows, "train/loss") == [0, 1, 2, 3]
    assert epochs_with(rows, "train/acc") == [0, 1, 2, 3]
    # What the learning curves plot: the history each checkpoint saves, every epoch's train
    # values too (Lightning logs them after the epoch's checkpoints are saved).
    plots = torch.load(checkpoint, weights_only=True)["callbacks"]["RunPlots"]["history"]
    assert sorted(plots["val/loss"]) == sorted(plots["train/acc"]) == [0, 1, 2, 3]
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
    (line,) = error_lines(caplog)
    assert "has finished training: its checkpoint has 4 epochs of trainer.max_epochs=4" in line
    assert "trainer.max_epochs=8" in line  # how to train further
    # How to test it again: a test-only run of the weights it ended with, in a folder of its own.
    assert f"train=false ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}" in line
    assert {name: (run_dir / name).read_bytes() for name in RECORD} == record
    assert not list(run_dir.glob("csv/hparams_resumed_*"))


class Killed(BaseException):
    """What a SIGKILL does to a write: it stops there, and nothing after it runs."""


def killed_after_the_header(monkeypatch) -> None:
    """The next csv.DictWriter stops after its header, before its rows."""
    real_writeheader = csv.DictWriter.writeheader

    def writeheader(writer: csv.DictWriter) -> None:
        real_writeheader(writer)
        raise Killed

    monkeypatch.setattr(csv.DictWriter, "writeheader", writeheader)


def test_a_kill_during_a_rewrite_leaves_the_history_whole(tmp_path: Path, monkeypatch) -> None:
    """Both rewrites of metrics.csv: a resumed run's (dropping the rows after its checkpoint)
    and a new column's (the header grows). Killed mid-write, the file keeps every row."""
    first = ResumableCSVLogger(tmp_path, name="csv", version="")
    write_rows(first, [(0, 5, {"val/loss": 2.0}), (0, 5, {"train/loss": 2.5})])
    metrics = tmp_path / "csv" / "metrics.csv"
    before = metrics.read_bytes()

    resumed = ResumableCSVLogger(tmp_path, name="csv", version="")
    killed_after_the_header(monkeypatch)
    with pytest.raises(Killed):
        resumed.continue_after(epoch=0, step=5)
    assert metrics.read_bytes() == before

    monkeypatch.undo()
    resumed.continue_after(epoch=0, step=5)
    resumed.log_metrics({"val/acc": 0.5, "epoch": 1}, step=10)  # a new column
    killed_after_the_header(monkeypatch)
    with pytest.raises(Killed):
        resumed.save()
    assert metrics.read_bytes() == before
    monkeypatch.undo()
    resumed.save()
    assert epochs_with(read_csv(metrics), "val/acc") == [1]
    assert epochs_with(read_csv(metrics), "train/loss") == [0]


def test_every_checkpoint_follows_the_rows_of_the_epochs_it_covers(
    compose_config, tmp_path: Path, monkeypatch
) -> None:
    """What a SIGKILL right after a checkpoint is written would leave: metrics.csv as it is
    then. Lightning logs an epoch's train values after its checkpoints are saved."""
    on_disk: dict[str, list[dict[str, str]]] = {}
    plotted: dict[str, list[int]] = {}  # the epochs of train values the learning curves get
    real_save = AtomicCheckpointIO.save_checkpoint

    def save_checkpoint(io, checkpoint, path, storage_options=None) -> None:
        real_save(io, checkpoint, path, storage_options)
        name = f"{Path(path).name}, epoch {checkpoint['epoch']}"
        on_disk[name] = read_csv(tmp_path / "run" / "csv" / "metrics.csv")
        plotted[name] = sorted(checkpoint["callbacks"]["RunPlots"]["history"]["train/loss"])

    monkeypatch.setattr(AtomicCheckpointIO, "save_checkpoint", save_checkpoint)
    run(compose_config("trainer=cpu", "debug=limit", "test=false", *QUIET))
    # An epoch's checkpoints are saved at its end, when Lightning still counts it as the current
    # epoch; none is written again when training ends.
    assert list(on_disk) == [
        f"{name}, epoch {epoch}"
        for epoch in range(3)
        for name in (f"epoch_00{epoch}.ckpt", "last.ckpt")
    ]
    for name, rows in on_disk.items():
        covered = list(range(int(name.split()[-1]) + 1))
        assert epochs_with(rows, "train/loss") == covered, name
        assert epochs_with(rows, "val/loss") == covered, name
        assert plotted[name] == covered, name


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def header(path: Path) -> str:
    return path.read_text().partition("\n")[0] if path.is_file() else ""


class KillAt(Callback):
    """SIGKILL this run at one moment: `new_column`, at its first write to metrics.csv after
    `train/acc` entered the header; `last`, right after last.ckpt of epoch `epoch` replaced the
    previous one; `rewrite`, as it starts rewriting the metrics.csv it resumes; `random`, at a
    random time within `seconds` of the first epoch after a checkpoint. Made only in the process
    it kills: it changes csv.DictWriter for the whole process."""

    def __init__(self, moment: str, metrics: str, epoch: int = 0, seconds: float = 1.0):
        self.moment, self.epoch, self.seconds = moment, epoch, seconds
        metrics, started = Path(metrics), header(Path(metrics))
        real_writerows, real_writeheader = csv.DictWriter.writerows, csv.DictWriter.writeheader

        def writerows(writer, rows):
            new_column = "train/acc" not in started and "train/acc" in header(metrics)
            if moment == "new_column" and new_column:
                die()
            return real_writerows(writer, rows)

        def writeheader(writer):
            if moment == "rewrite" and started:
                die()
            return real_writeheader(writer)

        csv.DictWriter.writerows, csv.DictWriter.writeheader = writerows, writeheader

    def setup(self, trainer, pl_module, stage):
        io = trainer.strategy.checkpoint_io
        real_save = io.save_checkpoint

        def save_checkpoint(checkpoint, path, storage_options=None):
            real_save(checkpoint, path, storage_options)
            last = Path(path).name == "last.ckpt" and checkpoint["epoch"] == self.epoch
            if self.moment == "last" and last:
                die()

        io.save_checkpoint = save_checkpoint

    def on_train_epoch_start(self, trainer, pl_module):
        if self.moment == "random" and trainer.current_epoch > 0:
            self.moment = "started"
            timer = threading.Timer(random.uniform(0, self.seconds), die)
            timer.daemon = True  # a run that ends first exits
            timer.start()


def exit_code_in_a_fork(cfg: DictConfig) -> int:
    """`run(cfg)` in a process forked from this one, which has imported all it needs (a new
    `python train.py` would import torch and Lightning again: seconds each): its exit code,
    `-signal.SIGKILL` when killed."""
    child = multiprocessing.get_context("fork").Process(target=run, args=(cfg,))
    child.start()
    child.join(timeout=300)
    return child.exitcode


# Run by run: each run is killed at one moment, the next resumes it from last.ckpt.
KILLS = [
    ["moment=new_column"],  # just after epoch 0's train row gave metrics.csv its train/ columns
    ["moment=last", "epoch=1"],  # between epoch 1's last.ckpt and the Trainer logging its train row
    ["moment=rewrite"],  # while the resumed run drops the rows after its checkpoint
    ["moment=random"],  # at a random time in the first epoch after a checkpoint
]


@pytest.mark.slow
def test_sigkill_at_any_moment_loses_no_row(compose_config, tmp_path: Path) -> None:
    """Killed at the moments that lost rows and at random, and resumed from last.ckpt each
    time: every epoch's train and val rows, once, and no other."""
    metrics = tmp_path / "run" / "csv" / "metrics.csv"
    epochs = 10  # enough that a random kill lands before the run ends
    args = ["trainer=cpu", "debug=limit", f"trainer.max_epochs={epochs}", "test=false",
            "callbacks.plots=null",
            *QUIET]  # fmt: skip
    resume: list[str] = []
    for kill in KILLS:
        killer = [
            f"+callbacks.kill._target_={__name__}.KillAt",
            f"+callbacks.kill.metrics={metrics}",
        ]
        code = exit_code_in_a_fork(
            compose_config(*args, *resume, *killer, *[f"+callbacks.kill.{k}" for k in kill])
        )
        if code == 0 and kill == ["moment=random"]:
            break  # the run finished first
        assert code == -signal.SIGKILL, kill
        resume = [f"ckpt_path={tmp_path / 'run' / 'checkpoints' / 'last.ckpt'}"]
    else:
        run(compose_config(*args, *resume))

    rows = read_csv(metrics)
    for name in ("train/loss", "train/acc", "val/loss", "val/acc"):
        assert epochs_with(rows, name) == list(range(epochs)), name
    # Nothing else: each epoch's train and val rows and its learning rate, once.
    assert len(rows) == 3 * epochs, rows
    assert len({row["step"] for row in rows if row["lr-AdamW"]}) == epochs
