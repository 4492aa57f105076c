"""Checkpoints in object storage: written, resumed, tested and predicted from by URL. fsspec's
in-memory file system stands in for s3:// and gs:// (the same code path: not the local disk)."""

import csv
from pathlib import Path

import fsspec
import pytest
import torch
from omegaconf import open_dict

from kindling.checkpoints import read_checkpoint
from kindling.errors import UserError
from kindling.loading import load_module
from kindling.predict import PredictArgs, predict
from kindling.train import run

from helpers import QUIET

TINY = ["trainer=cpu", "trainer.limit_train_batches=3", "trainer.limit_val_batches=2",
        "trainer.limit_test_batches=2", *QUIET]  # fmt: skip
# The best checkpoint is always the first one: each run tests it after training.
FIRST_IS_BEST = ["callbacks.model_checkpoint.monitor=step", "callbacks.model_checkpoint.mode=min"]


@pytest.fixture
def bucket(tmp_path: Path):
    """A folder of its own in fsspec's in-memory file system, removed afterwards."""
    url = f"memory://bucket/{tmp_path.name}"
    yield url
    fs = fsspec.filesystem("memory")
    if fs.exists(url):
        fs.rm(url, recursive=True)


def train_in(compose_config, folder: Path, *overrides: str) -> float | None:
    cfg = compose_config(*TINY, *overrides)
    with open_dict(cfg):
        cfg.paths.output_dir = str(folder)
    return run(cfg)


def test_checkpoints_go_to_a_url_and_resume_test_and_predict_from_it(
    compose_config, tmp_path: Path, bucket: str
) -> None:
    checkpoints = f"{bucket}/checkpoints"
    first = tmp_path / "first"
    to_bucket = [f"callbacks.model_checkpoint.dirpath={checkpoints}", *FIRST_IS_BEST]
    train_in(compose_config, first, "trainer.max_epochs=1", *to_bucket)
    fs = fsspec.filesystem("memory")
    assert sorted(Path(p).name for p in fs.ls(checkpoints, detail=False)) == [
        "epoch_000.ckpt", "last.ckpt"
    ]  # fmt: skip
    assert not (first / "checkpoints").exists()  # nothing written beside the run instead
    # The run was tested on the best checkpoint, read back from the URL.
    with open(first / "csv" / "metrics.csv") as f:
        assert any(row["test/acc"] for row in csv.DictReader(f))
    last = f"{checkpoints}/last.ckpt"
    assert read_checkpoint(last)["global_step"] == 3

    # Resume from the URL: training goes on from step 3, in a new local run folder.
    resumed = tmp_path / "resumed"
    train_in(compose_config, resumed, "trainer.max_epochs=2", f"ckpt_path={last}", *to_bucket)
    assert read_checkpoint(last)["global_step"] == 6
    with open(resumed / "csv" / "metrics.csv") as f:
        epochs = {row["epoch"] for row in csv.DictReader(f) if row["train/loss"]}
    assert epochs == {"1"}
    assert not (resumed / "checkpoints").exists()

    # Predict from the URL (what kindling.sample does too: load_module).
    module, _ = load_module(last)
    assert sum(p.numel() for p in module.parameters()) > 0
    output = predict(PredictArgs(ckpt_path=last, input="test", output=str(tmp_path / "p.csv")))
    assert len(output.read_text().splitlines()) > 1


def test_file_urls_are_local_files(trained_run) -> None:
    url = f"file://{trained_run.last_checkpoint}"
    assert read_checkpoint(url)["global_step"] == read_checkpoint(
        trained_run.last_checkpoint
    )["global_step"]  # fmt: skip


def test_a_missing_url_or_file_system_is_one_line(bucket: str) -> None:
    with pytest.raises(UserError, match="does not exist"):
        read_checkpoint(f"{bucket}/nothing.ckpt")
    fsspec.filesystem("memory").pipe(f"{bucket}/junk.ckpt", b"not a checkpoint")
    with pytest.raises(UserError, match="not a readable checkpoint"):
        read_checkpoint(f"{bucket}/junk.ckpt")
    with pytest.raises(UserError, match="Check ckpt_path"):
        read_checkpoint("nosuchprotocol://bucket/last.ckpt")


def test_the_atomic_writer_hands_urls_to_fsspec(bucket: str) -> None:
    from kindling.checkpoints import AtomicCheckpointIO

    AtomicCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(2)}}, f"{bucket}/a.ckpt")
    (written,) = fsspec.filesystem("memory").ls(bucket, detail=False)
    assert written.endswith(f"{Path(bucket).name}/a.ckpt")
    assert torch.equal(read_checkpoint(f"{bucket}/a.ckpt")["state_dict"]["w"], torch.ones(2))


def test_an_interrupt_saves_into_the_url_folder(bucket: str) -> None:
    from types import SimpleNamespace

    from lightning.pytorch.trainer.states import TrainerFn
    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from kindling.callbacks.interrupt import CheckpointOnInterrupt

    saved: list[str] = []
    trainer = SimpleNamespace(
        checkpoint_callback=SimpleNamespace(dirpath=f"{bucket}/checkpoints"),
        state=SimpleNamespace(fn=TrainerFn.FITTING), current_epoch=1, global_step=7,
        max_epochs=10, max_steps=-1, default_root_dir="unused", save_checkpoint=saved.append,
    )  # fmt: skip
    CheckpointOnInterrupt().on_exception(trainer, None, SIGTERMException())
    assert saved == [f"{bucket}/checkpoints/last.ckpt"]
