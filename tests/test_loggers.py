"""Experiment trackers for real: train briefly, then read the metrics back from each store."""

import csv
import json
import logging
import struct
import time
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import Logger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kindling.train import run

from helpers import QUIET, error_lines

FAST = ["debug=limit", "trainer=cpu", *QUIET]  # 3 epochs of 5 batches, 2 test batches
EPOCHS = 3


def csv_series(run_dir: Path, name: str) -> list[float]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        return [float(row[name]) for row in csv.DictReader(f) if row.get(name)]


def tensorboard_series(log_dir: Path, name: str) -> list[float]:
    # Fit and test each leave an event file; read them in the order they were written.
    values = []
    for event_file in sorted(log_dir.glob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(event_file)).Reload()
        if name in accumulator.Tags()["scalars"]:
            values += [event.value for event in accumulator.Scalars(name)]
    return values


def test_csv_tensorboard_and_mlflow_record_the_same_metrics(compose_config, tmp_path) -> None:
    mlflow = pytest.importorskip("mlflow", reason='needs the trackers extra (".[trackers]")')
    cfg = compose_config("logger=many", *FAST)
    assert set(cfg.logger) == {"csv", "tensorboard", "mlflow"}
    run(cfg)
    run_dir = tmp_path / "run"

    client = mlflow.tracking.MlflowClient(tracking_uri=cfg.logger.mlflow.tracking_uri)
    assert (tmp_path / "logs" / "mlflow.db").is_file()  # a real database, next to the runs
    experiment = client.get_experiment_by_name(cfg.task_name)
    (mlflow_run,) = client.search_runs([experiment.experiment_id])
    assert mlflow_run.info.status == "FINISHED"

    def mlflow_series(name: str) -> list[float]:
        history = client.get_metric_history(mlflow_run.info.run_id, name)
        return [m.value for m in sorted(history, key=lambda m: (m.step, m.timestamp))]

    for name, per_run in [("val/acc", EPOCHS), ("val/loss", EPOCHS), ("train/loss", EPOCHS),
                          ("val/acc_best", EPOCHS), ("test/acc", 1)]:  # fmt: skip
        from_csv = csv_series(run_dir, name)
        assert len(from_csv) == per_run, name
        assert tensorboard_series(run_dir / "tensorboard", name) == pytest.approx(from_csv)
        assert mlflow_series(name) == pytest.approx(from_csv)

    # Sensible values: accuracies are fractions, losses positive, the best is the running max.
    val_acc = csv_series(run_dir, "val/acc")
    assert all(0.0 <= a <= 1.0 for a in val_acc)
    assert all(loss > 0 for loss in csv_series(run_dir, "train/loss"))
    best = csv_series(run_dir, "val/acc_best")
    assert best == pytest.approx([max(val_acc[: i + 1]) for i in range(EPOCHS)])
    # The whole resolved config is logged as parameters, tags included.
    params = mlflow_run.data.params
    assert params["seed"] == str(cfg.seed)
    assert params["tags"] == str(list(cfg.tags))
    assert params["model/net/_target_"] == cfg.model.net._target_
    # What produced the run: in the params and as tags (MLflow shows its own git tag).
    assert params["provenance/versions/torch"] == torch.__version__
    tags = mlflow_run.data.tags
    assert tags["version.lightning"] == params["provenance/versions/lightning"]
    commit = params["provenance/git/commit"]
    assert tags.get("mlflow.source.git.commit", "no git") == commit


def read_wandb_records(path: Path) -> list | None:
    """The records of an offline `.wandb` file (LevelDB log format: 32 KiB blocks of chunks),
    or None when the file does not start as this format does."""
    from wandb.proto import wandb_internal_pb2

    raw = path.read_bytes()
    if raw[:4] != b":W&B":
        return None
    block, position, pending, records = 32768, 7, b"", []
    while position + 7 <= len(raw):
        if block - position % block < 7:  # a block's tail too short for a chunk header is padding
            position += block - position % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[position : position + 7])
        if position + 7 + length > len(raw):  # a chunk still being written
            break
        data = raw[position + 7 : position + 7 + length]
        position += 7 + length
        pending = data if kind in (1, 2) else pending + data  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def wandb_history(run_file: Path, last_metric: str, timeout: float = 30.0) -> list[dict] | None:
    """The history rows of an offline `.wandb` file, or None for an unknown format.

    wandb's service writes the file from its own process and may still be flushing it when
    `wandb.finish()` returns: read again until `last_metric` is there or `timeout` passes.
    """
    deadline = time.monotonic() + timeout
    while True:
        records = read_wandb_records(run_file)
        if records is None:
            return None
        history = [
            {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            for record in records
            if record.WhichOneof("record_type") == "history"
        ]
        if any(last_metric in row for row in history) or time.monotonic() > deadline:
            return history
        time.sleep(0.5)


def test_wandb_offline_run_holds_the_metrics(compose_config, tmp_path, monkeypatch) -> None:
    wandb = pytest.importorskip("wandb", reason='needs the trackers extra (".[trackers]")')
    # No account, no network, nothing written outside tmp_path.
    monkeypatch.setenv("WANDB_MODE", "offline")
    for variable in ["WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"]:
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run(compose_config("logger=[csv,wandb]", *FAST))
    # Lightning leaves the wandb run open; its records reach the file when it finishes.
    wandb.finish()
    run_dir = tmp_path / "run"

    (run_file,) = (run_dir / "wandb").glob("offline-run-*/run-*.wandb")
    history = wandb_history(run_file, last_metric="test/acc")
    assert history is not None, f"{run_file} is not in the format read_wandb_records reads"
    val_acc = [row["val/acc"] for row in history if "val/acc" in row]
    assert val_acc == pytest.approx(csv_series(run_dir, "val/acc"))
    assert len(val_acc) == EPOCHS
    test_acc = [row["test/acc"] for row in history if "test/acc" in row]
    assert test_acc == pytest.approx(csv_series(run_dir, "test/acc"))


def test_each_job_of_one_process_gets_its_own_wandb_run(
    compose_config, tmp_path, monkeypatch
) -> None:
    """A Hydra multirun runs its jobs one after the other in one process, as here."""
    wandb = pytest.importorskip("wandb", reason='needs the trackers extra (".[trackers]")')
    monkeypatch.setenv("WANDB_MODE", "offline")
    for variable in ["WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"]:
        monkeypatch.setenv(variable, str(tmp_path / "wandb-home"))
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_files = []
    try:
        for job in ["job0", "job1"]:
            cfg = compose_config("logger=wandb", *FAST, "trainer.max_epochs=1")
            cfg.paths.output_dir = str(tmp_path / job)
            run(cfg)
            run_files += list((tmp_path / job / "wandb").glob("offline-run-*/run-*.wandb"))
    finally:
        wandb.finish()
    assert len(run_files) == 2, run_files  # one wandb run per job, not one shared by both


class BrokenTracker(Logger):
    """A tracker whose server stops answering at its `fail_at`-th write."""

    def __init__(self, fail_at: int) -> None:
        super().__init__()
        self.fail_at, self.writes = fail_at, 0

    name, version = "broken", 0

    def _write(self) -> None:
        self.writes += 1
        if self.writes >= self.fail_at:
            raise ConnectionError("unreachable.\nRetried 7 times.")

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        self._write()

    def log_metrics(self, metrics, step=None) -> None:
        self._write()


class RemoveStore(L.Callback):
    """Deletes the MLflow database the run logs to once epoch 0 is done, as a cleanup script or
    a full disk might: MLflow fails on its next write."""

    def __init__(self, database: str) -> None:
        self.database = Path(database)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.current_epoch == 0:
            self.database.unlink()


@pytest.mark.slow
def test_a_tracker_that_fails_mid_run_is_warned_once_and_training_goes_on(
    compose_config, tmp_path, caplog, capfd
) -> None:
    pytest.importorskip("mlflow", reason='needs the trackers extra (".[trackers]")')
    database = tmp_path / "logs" / "mlflow.db"
    cfg = compose_config(
        "logger=[csv,mlflow]", *FAST, "+callbacks.remove_store._target_=test_loggers.RemoveStore",
        f"+callbacks.remove_store.database={database}",
    )  # fmt: skip
    caplog.set_level(logging.WARNING)
    run(cfg)
    (line,) = [r.getMessage() for r in caplog.records if "MLFlowLogger" in r.getMessage()]
    assert "\n" not in line and "left out" in line and "OperationalError" in line
    # MLflow's own lines about the failure (an error and two tracebacks) are held back.
    printed = capfd.readouterr().err
    assert "Traceback" not in printed and "SQLAlchemy" not in printed, printed[-2000:]
    run_dir = tmp_path / "run"
    with open(run_dir / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    for name in ["train/loss", "val/acc"]:
        assert [int(row["epoch"]) for row in rows if row[name]] == list(range(EPOCHS)), name
    assert len(csv_series(run_dir, "test/acc")) == 1
    assert (run_dir / "checkpoints" / "last.ckpt").is_file()


def test_mlflow_without_a_tracking_uri_is_one_line_naming_the_key(
    compose_config, caplog, monkeypatch
) -> None:
    pytest.importorskip("mlflow", reason='needs the trackers extra (".[trackers]")')
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    cfg = compose_config("logger=mlflow", "logger.mlflow.tracking_uri=null", *FAST)
    line = stopped_in_one_line(cfg, caplog)
    assert line.startswith("logger.mlflow.tracking_uri is null and MLFLOW_TRACKING_URI is not set")
    assert "\n" not in line


def test_a_tracker_that_fails_before_training_is_one_line_naming_it(compose_config, caplog) -> None:
    cfg = compose_config(
        "logger=[csv]", *FAST, "+logger.broken._target_=test_loggers.BrokenTracker",
        "+logger.broken.fail_at=1",
    )  # fmt: skip
    line = stopped_in_one_line(cfg, caplog)
    assert line.startswith("logger.broken failed before training: ConnectionError: unreachable.")
    assert "\n" not in line
    assert not (Path(cfg.paths.output_dir) / "checkpoints").exists()  # before any work


def stopped_in_one_line(cfg, caplog) -> str:
    """The one line a run that stops before any work logs (exit status 1)."""
    with pytest.raises(SystemExit) as stopped:
        run(cfg)
    assert stopped.value.code == 1
    (line,) = error_lines(caplog)
    return line
