"""Prepared copies (`python -m kindling.prepare`) streamed with LitData (`data=streaming`)."""

import functools
import json
import logging
import math
import os
import shlex
import shutil
import signal
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import NamedTuple

import lightning as L
import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import Callback
from litdata import StreamingDataset
from omegaconf import open_dict
from PIL import Image
from torch.utils.data import Dataset
from torchvision.transforms import v2

from kindling.config.instantiate import build
from kindling.data.image_folder import ImageFolderDataModule
from kindling.data.sequences import SequenceTableDataModule
from kindling.data.streaming import METADATA_FILE, StreamingDataModule, read_metadata
from kindling.errors import UserError
from kindling.prepare import prepare
from kindling.train import augment_images_only, fill_in_from_data, run
from kindling.train_checks import check_model_reads_data

from helpers import (
    QUIET,
    error_lines,
    made_once,
    options,
    pattern_rows,
    prepare_cfg,
    train_py,
    write_table,
)

IMAGES = 96  # image i is grey, every pixel STEP * i: a batch says which samples it holds
STEP = 2
FOLDER = ["data=image_folder", "data.image_size=8", "data.channels=1"]


def write_images(root: Path) -> Path:
    """96 real PNG files of 8x8 in two class folders: `<root>/<even|odd>/<i>.png`."""
    for i in range(IMAGES):
        folder = root / ("even", "odd")[i % 2]
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((8, 8), STEP * i, dtype=np.uint8)).save(folder / f"{i:02d}.png")
    return root


def prepare_folder(images: Path, output: Path) -> Path:
    return prepare(prepare_cfg(*FOLDER, f"data.path={images}", f"output={output}", "num_workers=2"))


@pytest.fixture(scope="session")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A prepared copy of the 96 images (train 77, val 9, test 10), made once per session: tests
    read it, or copy it to change it."""

    def make(folder: Path) -> None:
        prepare_folder(write_images(folder / "images"), folder / "prepared")

    folder, _ = made_once(tmp_path_factory, "streaming_images_copy", make)
    return folder / "prepared"


def copy_of(prepared: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(prepared, tmp_path / "copy"))


def streaming(input_dir: Path, **kwargs) -> StreamingDataModule:
    args = {"num_classes": 2, "image_shape": [1, 8, 8], "batch_size": 4, "num_workers": 0}
    return StreamingDataModule(str(input_dir), **{**args, **kwargs})


def sample_ids(images: torch.Tensor) -> list[int]:
    """Which images a uint8 batch holds (image i is all STEP * i)."""
    return (images[:, 0, 0, 0].long() // STEP).tolist()


def test_prepare_writes_each_split_and_describes_the_copy(prepared: Path, tmp_path: Path) -> None:
    metadata = json.loads((prepared / METADATA_FILE).read_text())
    assert metadata["complete"] is True
    assert metadata["classes"] == ["even", "odd"]
    assert metadata["image_shape"] == [1, 8, 8]
    assert metadata["splits"] == {"train": 77, "val": 9, "test": 10}
    # The statistics the image folder measures, carried with the copy.
    images = ImageFolderDataModule(str(tmp_path / "images"), 2, image_size=8, channels=1)
    write_images(tmp_path / "images")
    images.setup("fit")
    assert metadata["mean"] == pytest.approx(images.mean.flatten().tolist())
    assert metadata["std"] == pytest.approx(images.std.flatten().tolist())
    for split in ("train", "val", "test"):
        assert (prepared / split / "index.json").is_file()
    # Every image once, split as the image folder splits it.
    data = streaming(prepared)
    data.setup("fit")
    seen = {}
    for split in ("train", "val", "test"):
        dataset = getattr(data, f"data_{split}")
        seen[split] = sorted(sample_ids(torch.stack([dataset[i][0] for i in range(len(dataset))])))
        folder = getattr(images, f"data_{split}").samples
        assert seen[split] == sorted(int(path.stem) for path, _ in folder)
        labels = [dataset[i][1] for i in range(len(dataset))]
        assert labels == [int(dataset[i][0][0, 0, 0]) // STEP % 2 for i in range(len(dataset))]


def test_prepare_again_on_a_finished_copy_does_nothing(
    prepared: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kindling")
    copy = copy_of(prepared, tmp_path)
    chunks = {p: p.stat().st_mtime_ns for p in copy.rglob("*.bin")}
    prepare_folder(Path(read_metadata(str(copy))["source"]["path"]), copy)
    assert "already prepared" in caplog.text
    assert {p: p.stat().st_mtime_ns for p in copy.rglob("*.bin")} == chunks


def test_prepare_refuses_a_folder_that_is_not_a_prepared_copy(tmp_path: Path) -> None:
    (tmp_path / "output").mkdir()
    (tmp_path / "output" / "notes.txt").write_text("mine")
    with pytest.raises(UserError, match="not a prepared copy"):
        prepare_folder(write_images(tmp_path / "images"), tmp_path / "output")
    assert (tmp_path / "output" / "notes.txt").read_text() == "mine"


def test_an_interrupted_prepare_is_refused_by_training_and_redone_by_prepare(
    prepared: Path, tmp_path: Path
) -> None:
    copy = copy_of(prepared, tmp_path)
    metadata = json.loads((copy / METADATA_FILE).read_text())
    del metadata["complete"]
    (copy / METADATA_FILE).write_text(json.dumps(metadata))
    shutil.rmtree(copy / "test")
    with pytest.raises(UserError, match=r"unfinished prepare.*Run it again"):
        streaming(copy).setup("fit")
    metadata["source"]["path"] = str(write_images(tmp_path / "images"))
    (copy / METADATA_FILE).write_text(json.dumps(metadata))
    prepare_folder(tmp_path / "images", copy)
    assert read_metadata(str(copy))["complete"] is True
    assert (copy / "test" / "index.json").is_file()


def test_prepare_writes_an_in_memory_data_set(tmp_path: Path) -> None:
    """data=digits has no files: its splits are written from memory, back to uint8 pixels."""
    output = prepare(prepare_cfg("data=digits", f"output={tmp_path / 'digits'}", "num_workers=1"))
    metadata = read_metadata(str(output))
    assert metadata["splits"] == {"train": 1294, "val": 144, "test": 359}
    assert metadata["classes"] == [str(i) for i in range(10)]
    data = streaming(output, num_classes=10)
    data.setup("fit")
    image, label = data.data_test[0]
    assert image.dtype == torch.uint8 and image.shape == (1, 8, 8)
    # The digits' 17 grey levels (0..16), as pixels: 255 * k / 16.
    levels = {round(255 * k / 16) for k in range(17)}
    assert set(image.unique().tolist()) <= levels
    assert 0 <= label < 10


@pytest.mark.parametrize(
    "change, message",
    [
        ({"format": 0, "kindling_version": "0.0.1"}, r"by kindling 0.0.1.*Prepare it again"),
        ({"format": 1}, r"format 1 streams samples in the source's order.*Prepare it again"),
        ({"complete": False}, "unfinished prepare"),
    ],
)
def test_a_copy_from_another_kindling_or_unfinished_is_refused(
    prepared: Path, tmp_path: Path, change: dict, message: str
) -> None:
    copy = copy_of(prepared, tmp_path)
    metadata = {**json.loads((copy / METADATA_FILE).read_text()), **change}
    (copy / METADATA_FILE).write_text(json.dumps(metadata))
    with pytest.raises(UserError, match=message):
        streaming(copy).setup("fit")


def test_a_missing_copy_names_the_prepare_command(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"not a prepared copy.*python -m kindling.prepare"):
        read_metadata(str(tmp_path / "nowhere"))


def test_an_unwritable_cache_dir_is_refused(prepared: Path, tmp_path: Path) -> None:
    (tmp_path / "cache").write_text("a file, not a folder")
    with pytest.raises(UserError, match=r"data.cache_dir=.* is not writable"):
        streaming(prepared, cache_dir=str(tmp_path / "cache" / "chunks")).setup("fit")


def largest_chunk(split: Path) -> Path:
    """The chunk file that holds most of a split (prepare's workers write one each)."""
    return max(split.glob("chunk-*.bin"), key=lambda chunk: chunk.stat().st_size)


def damage(chunk: Path, how: str) -> None:
    if how == "deleted":
        chunk.unlink()
    else:
        chunk.write_bytes(chunk.read_bytes()[: chunk.stat().st_size // 2])


def one_line_naming(error: BaseException, path: Path) -> str:
    message = str(error)
    assert "\n" not in message
    assert str(path) in message and "python -m kindling.prepare" in message
    return message


@pytest.mark.parametrize("how", ["deleted", "cut to half"])
@pytest.mark.parametrize("split", ["train", "test"])
def test_a_damaged_chunk_is_named_before_training(
    prepared: Path, tmp_path: Path, split: str, how: str
) -> None:
    copy = copy_of(prepared, tmp_path)
    chunk = largest_chunk(copy / split)
    damage(chunk, how)
    with pytest.raises(UserError) as refused:
        streaming(copy).setup("fit")
    assert ("is missing" if how == "deleted" else "is cut short") in one_line_naming(
        refused.value, chunk
    )


def test_a_damaged_index_is_named_before_training(prepared: Path, tmp_path: Path) -> None:
    copy = copy_of(prepared, tmp_path)
    index = copy / "val" / "index.json"
    index.write_text(index.read_text()[:40])
    with pytest.raises(UserError) as refused:
        streaming(copy).setup("fit")
    one_line_naming(refused.value, index)


class DamageChunk(Callback):
    """Damages a chunk once training starts, after setup checked the copy: as a copy on object
    storage, which setup cannot check, fails. `deleted`, or `scrambled`: random bytes of the
    same size, which setup's size check cannot see."""

    def __init__(self, chunk: str, how: str) -> None:
        self.chunk, self.how = Path(chunk), how

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.how == "deleted":
            self.chunk.unlink()
        else:
            self.chunk.write_bytes(os.urandom(self.chunk.stat().st_size))


@pytest.mark.parametrize(
    ("how", "named"), [("deleted", "could not be read"), ("scrambled", "does not match")]
)
def test_a_chunk_damaged_while_training_is_named_in_one_line(
    prepared: Path, compose_config, tmp_path: Path, caplog, how: str, named: str
) -> None:
    copy = copy_of(prepared, tmp_path)
    chunk = largest_chunk(copy / "train")
    damage = {"_target_": "test_streaming.DamageChunk", "chunk": str(chunk), "how": how}
    with pytest.raises(SystemExit) as stopped:  # read in a DataLoader worker
        train_streaming(compose_config, copy, tmp_path / "run", "data.num_workers=1", delete=damage)
    assert stopped.value.code == 1
    (line,) = error_lines(caplog)
    assert named in one_line_naming(Exception(line), chunk)


@pytest.fixture
def no_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """No credentials anywhere, no instance metadata service, nothing from ~/.aws."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-credentials"))
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    return monkeypatch


def test_s3_without_credentials_says_so(no_aws: pytest.MonkeyPatch) -> None:
    with pytest.raises(UserError, match=r"^No credentials for s3://bucket/prefix/kindling.json"):
        read_metadata("s3://bucket/prefix")


def test_an_unreachable_s3_address_says_so(no_aws: pytest.MonkeyPatch) -> None:
    no_aws.setenv("AWS_ACCESS_KEY_ID", "id")
    no_aws.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    no_aws.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    with pytest.raises(UserError, match=r"cannot be reached .*AWS_ENDPOINT_URL") as error:
        read_metadata("s3://bucket/prefix")
    assert "credentials" not in str(error.value).lower()


def test_batches_are_standardised_on_the_device_with_the_copys_statistics(prepared: Path) -> None:
    data = streaming(prepared)
    data.setup("fit")
    images, labels = next(iter(data.val_dataloader()))
    assert images.dtype == torch.uint8
    model_input, _ = data.on_after_batch_transfer((images, labels), 0)
    expected = (images.float() / 255 - data.mean) / data.std
    torch.testing.assert_close(model_input, expected)


def test_training_augments_each_sample_the_same_way_wherever_it_is_read(prepared: Path) -> None:
    """A sample's augmentation depends on the seed, the epoch and the sample alone: not on
    which worker reads it, nor on the order (so a resumed run draws what the first one would)."""
    crop = {"crop": v2.RandomCrop(size=[8, 8], padding=4)}  # zero padding shows the offset

    def epochs(workers: int) -> list[dict[int, torch.Tensor]]:
        data = streaming(prepared, augment=crop, num_workers=workers, shuffle_seed=3)
        data.setup("fit")
        loader = data.train_dataloader()
        return [
            {image.max().item() // STEP: image for batch, _ in loader for image in batch}
            for _epoch in range(2)
        ]

    in_process, in_workers = epochs(workers=0), epochs(workers=2)
    for one, other in zip(in_process, in_workers, strict=True):
        assert one.keys() == other.keys()
        assert all(torch.equal(one[i], other[i]) for i in one)
    first, second = in_process
    cropped = [i for i in first if i and (first[i] == 0).any()]
    assert cropped, "the crop moved no image"
    assert any(not torch.equal(first[i], second[i]) for i in first), "same draws every epoch"


def test_checkpoints_hold_the_class_names_and_statistics(prepared: Path, compose_config) -> None:
    cfg = compose_config(
        "data=streaming", f"data.input_dir={prepared}", "data.num_workers=0",
        "data.batch_size=8", "trainer=cpu", "trainer.max_epochs=1", *QUIET,
    )  # fmt: skip
    run(cfg)  # reads the class count and image shape from the copy into the config
    assert cfg.data.num_classes == 2 and list(cfg.data.image_shape) == [1, 8, 8]
    checkpoint = torch.load(
        Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt", weights_only=True
    )
    state = checkpoint["StreamingDataModule"]
    assert state["classes"] == ["even", "odd"]
    assert state["mean"].flatten().tolist() == pytest.approx(read_metadata(str(prepared))["mean"])


def train_streaming(compose_config, prepared: Path, folder: Path, *overrides: str, **callbacks):
    """A 2-epoch run on the prepared copy, in `folder`; what `run` returns is the last val/loss."""
    cfg = compose_config(
        "data=streaming", f"data.input_dir={prepared}", "data.batch_size=8",
        "trainer=cpu", "trainer.max_epochs=2", "trainer.deterministic=true",
        "optimized_metric=val/loss", "test=false", "logger=none", *QUIET,
        "callbacks.model_checkpoint.save_top_k=-1",  # last.ckpt every epoch, improved or not
        *overrides,
    )  # fmt: skip
    with open_dict(cfg):
        cfg.paths.output_dir = str(folder)
        cfg.callbacks.update(callbacks)
    return run(cfg)


def weights(checkpoint: Path) -> dict[str, torch.Tensor]:
    return torch.load(checkpoint, weights_only=True)["state_dict"]


class SigtermAt(Callback):
    """Sends this process SIGTERM at the end of training step `step`, as a cluster would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


STEP_CHECKPOINTS = {
    "_target_": "lightning.pytorch.callbacks.ModelCheckpoint",
    "filename": "step_{step}",
    "every_n_train_steps": 4,
    "save_top_k": -1,
    "auto_insert_metric_name": False,
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "stop, workers, schedule",
    [
        # The cosine schedule reads trainer.estimated_stepping_batches, which makes the train
        # loader before the checkpoint's loop state is loaded (Lightning then skips it).
        ("step checkpoint", 0, []),
        ("SIGTERM", 2, ["model.scheduler=null"]),
    ],
)
def test_a_run_resumed_mid_epoch_ends_as_the_uninterrupted_one(
    prepared: Path, compose_config, tmp_path: Path, stop: str, workers: int, schedule: list[str]
) -> None:
    """9 batches an epoch: stopped after step 12 (3 into the second epoch) and resumed, the
    run reads the 6 batches left, in order, and ends with the same weights and val/loss."""
    overrides = [f"data.num_workers={workers}", "data/augment=flip_crop", *schedule,
                 "data.image_shape=[1,8,8]"]  # fmt: skip
    steps = {**STEP_CHECKPOINTS, "dirpath": str(tmp_path / "steps")}
    whole = train_streaming(compose_config, prepared, tmp_path / "whole", *overrides, steps=steps)
    if stop == "SIGTERM":
        stopper = {"_target_": f"{__name__}.SigtermAt", "step": 12}
        with pytest.raises(SystemExit) as stopped:
            train_streaming(compose_config, prepared, tmp_path / "first", *overrides, stop=stopper)
        assert stopped.value.code == 128 + signal.SIGTERM
        checkpoint = tmp_path / "first" / "checkpoints" / "last.ckpt"
    else:
        checkpoint = tmp_path / "steps" / "step_12.ckpt"
    assert torch.load(checkpoint, weights_only=True)["global_step"] == 12
    resumed = train_streaming(
        compose_config, prepared, tmp_path / "resumed", *overrides,
        f"ckpt_path={checkpoint}", "resume_in_new_folder=true",
    )  # fmt: skip
    assert resumed == pytest.approx(whole, abs=1e-6)
    first = weights(tmp_path / "whole" / "checkpoints" / "last.ckpt")
    second = weights(tmp_path / "resumed" / "checkpoints" / "last.ckpt")
    for name, value in first.items():
        torch.testing.assert_close(second[name], value, rtol=0, atol=1e-6)


# The ranks import it from a file of its own: importing this module would cost them its imports.
RECORD_SAMPLES = (
    f"STEP = {STEP}\n"
    + """
import json
from pathlib import Path

from lightning.pytorch.callbacks import Callback


class RecordSamples(Callback):
    # Writes `<run>/samples_rank<r>.json`: the images of every training and validation batch
    # this process saw, by epoch (image i is all STEP * i: the images say which samples they are).

    def __init__(self):
        self.seen = {"train": [], "val": []}

    def _record(self, trainer, stage, images, batch_idx):
        data = trainer.datamodule
        pixels = images[:, 0, 0, 0] * data.std.flatten()[0] + data.mean.flatten()[0]
        if batch_idx == 0:
            self.seen[stage].append([])
        self.seen[stage][-1] += (pixels * 255 / STEP).round().long().tolist()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._record(trainer, "train", batch[0], batch_idx)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0):
        if not trainer.sanity_checking:
            self._record(trainer, "val", batch[0], batch_idx)

    def on_fit_end(self, trainer, pl_module):
        path = Path(trainer.default_root_dir) / f"samples_rank{trainer.global_rank}.json"
        path.write_text(json.dumps(self.seen))
"""
)
# The command `prepare` prints for each copy is run with these. The copy of images trains on two
# processes that record the samples they read, for
# test_two_processes_read_disjoint_parts_of_each_epoch_in_step: 77 training images over 2
# processes of 4 are 9 batches each.
PRINTED_COMMAND_EXTRAS = {
    "images": [
        "data.batch_size=8", "data.num_workers=1", "data/augment=none", "trainer=ddp_cpu",
        "trainer.max_epochs=2", "+callbacks.record._target_=record_samples_by_id.RecordSamples",
    ],
    "sequences": ["trainer.max_epochs=1"],
}  # fmt: skip


class PrintedCommandRun(NamedTuple):
    line: str  # what prepare printed last: "... Train with: python train.py ..."
    returncode: int
    output: str  # its stdout and stderr
    cwd: Path  # where it ran: its run folder is the one of logs/train/runs/


class LinesLogged(logging.Handler):
    """The messages of the INFO records it is given."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def printed_command_run(copy: Path, data: list[str], extras: list[str], folder: Path) -> dict:
    """Prepare `copy` again (it is there: prepare only prints the command that trains on it),
    then run that command with `extras`, in `folder`."""
    lines = LinesLogged()
    logger = logging.getLogger("kindling")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(lines)
    try:
        source = read_metadata(str(copy))["source"]["path"]
        prepare(prepare_cfg(*data, f"data.path={source}", f"output={copy}"))
    finally:
        logger.removeHandler(lines)
        logger.setLevel(level)
    line = [message for message in lines.messages if "Train with: " in message][-1]
    _, _, *overrides = shlex.split(line.split("Train with: ")[1])
    (folder / "record_samples_by_id.py").write_text(RECORD_SAMPLES)
    result = train_py(*overrides, *extras, *QUIET, cwd=folder, module_dir=folder)
    return {"line": line, "returncode": result.returncode, "output": result.stdout + result.stderr}


@pytest.fixture(scope="session")
def trained_by_printed_command(
    tmp_path_factory: pytest.TempPathFactory, prepared: Path, sequence_copy: Path
) -> Callable[[str], PrintedCommandRun]:
    """`trained_by_printed_command(kind)`: the run of the command that prepare prints for the copy
    of images or of sequences, made once per session."""

    @functools.cache  # without pytest-xdist, made_once makes anew at each call
    def made(kind: str) -> PrintedCommandRun:
        copy = prepared if kind == "images" else sequence_copy
        data = FOLDER if kind == "images" else ["data=sequences", "data.missing=mean"]
        folder, result = made_once(
            tmp_path_factory, f"streaming_printed_command_{kind}",
            lambda folder: printed_command_run(copy, data, PRINTED_COMMAND_EXTRAS[kind], folder),
        )  # fmt: skip
        return PrintedCommandRun(**result, cwd=folder)

    return made


@pytest.mark.slow
def test_two_processes_read_disjoint_parts_of_each_epoch_in_step(
    trained_by_printed_command,
) -> None:
    """77 training images over 2 processes of 4: each reads 36 others, 9 batches, every epoch
    (no process waits at the end); validation: one batch of 4 each, 8 of its 9 images, once."""
    result = trained_by_printed_command("images")
    assert result.returncode == 0, result.output[-4000:]
    (run_dir,) = (result.cwd / "logs" / "train" / "runs").iterdir()
    ranks = [json.loads((run_dir / f"samples_rank{r}.json").read_text()) for r in (0, 1)]
    train = [rank["train"] for rank in ranks]
    assert [len(epochs) for epochs in train] == [2, 2]
    for epoch in range(2):
        first, second = train[0][epoch], train[1][epoch]
        assert len(first) == len(second) == 36
        assert not set(first) & set(second)
        assert len(set(first)) == 36
    assert train[0][0] != train[0][1], "the same order every epoch"
    val = ranks[0]["val"][0] + ranks[1]["val"][0]
    assert len(val) == len(set(val)) == 8
    assert not set(val) & set(train[0][0] + train[1][0])


# Copies of sequences (python -m kindling.prepare data=sequences): the table's sequences, streamed.


def write_sequences(folder: Path) -> None:
    """40 sequences of 5-50 steps (tests/test_sequences.py), one feature value missing, in
    `<folder>/table.csv`, and its copy in `<folder>/prepared`."""
    rows = pattern_rows(40, seed=4)
    rows[7]["x"] = None
    table = write_table(rows, folder / "table.csv")
    prepare(prepare_cfg(
        "data=sequences", f"data.path={table}", "data.missing=mean",
        f"output={folder / 'prepared'}", "num_workers=1",
    ))  # fmt: skip


@pytest.fixture(scope="session")
def sequences_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The table and its copy, made once per session (read only)."""
    folder, _ = made_once(tmp_path_factory, "streaming_sequences_copy", write_sequences)
    return folder


@pytest.fixture(scope="session")
def sequence_table(sequences_folder: Path) -> Path:
    return sequences_folder / "table.csv"


@pytest.fixture(scope="session")
def sequence_copy(sequences_folder: Path) -> Path:
    return sequences_folder / "prepared"


def streamed_sequences(copy: Path, **kwargs) -> StreamingDataModule:
    args = {"num_features": 3, "max_length": 47, "batch_size": 4, "num_workers": 0}  # the table's
    return StreamingDataModule(str(copy), 3, **{**args, **kwargs})


def served(split: Dataset) -> list[tuple[int, tuple[float, ...]]]:
    """Each `(steps, label)` of a split as `(label, steps' values)`, in a fixed order."""
    return sorted((int(label), tuple(steps.flatten().tolist())) for steps, label in split)


def test_a_copy_of_sequences_serves_the_tables_sequences(
    sequence_table: Path, sequence_copy: Path
) -> None:
    table = SequenceTableDataModule(str(sequence_table), 3, 3, missing="mean")
    table.setup("fit")
    metadata = read_metadata(str(sequence_copy))
    longest = max(len(steps) for steps, _ in table.data_train + table.data_val + table.data_test)
    assert {key: metadata[key] for key in ("kind", "classes", "features", "num_features")} == {
        "kind": "sequences", "classes": ["down", "flat", "up"], "features": ["x", "y", "z"],
        "num_features": 3,
    }  # fmt: skip
    assert metadata["max_length"] == longest and "image_shape" not in metadata
    assert metadata["mean"] == table.mean.tolist() and metadata["std"] == table.std.tolist()
    data = streamed_sequences(sequence_copy)
    data.setup("fit")
    # The same standardised steps (the missing value the training mean: 0), labels and lengths.
    for name in ("train", "val", "test"):
        streamed = served(getattr(data, f"data_{name}"))
        assert streamed == served(getattr(table, f"data_{name}")), name
        assert metadata["splits"][name] == len(streamed)
    assert not any(math.isnan(value) for _, steps in served(data.data_train) for value in steps)
    # Stored in a seeded random order: a copy in the table's order streams it nearly sorted.
    stored = [sample["index"] for sample in StreamingDataset(str(sequence_copy / "train"))]
    assert sorted(stored) == list(range(len(stored))) and stored != sorted(stored)
    # Batches padded as data=sequences pads them: zeros after each end, with the lengths.
    steps, lengths, labels = next(iter(data.val_dataloader()))
    assert steps.shape == (4, int(lengths.max()), 3) and labels.dtype == torch.long
    assert all(one[length:].abs().sum() == 0 for one, length in zip(steps, lengths, strict=True))
    assert data.on_after_batch_transfer((steps, lengths, labels), 0)[0] is steps


def test_a_checkpoints_statistics_standardise_the_streamed_sequences(sequence_copy: Path) -> None:
    """Lightning loads a checkpoint's state after `setup`: its statistics apply, not the copy's."""
    data = streamed_sequences(sequence_copy)
    data.setup("fit")
    raw = next(iter(StreamingDataset(str(sequence_copy / "test"))))
    mean, std = torch.tensor([1.0, 2.0, 3.0]), torch.tensor([2.0, 4.0, 8.0])
    data.load_state_dict({**data.state_dict(), "mean": mean, "std": std})
    steps, _ = next(iter(data.data_test))
    torch.testing.assert_close(steps, ((raw["steps"] - mean) / std).nan_to_num(0.0))
    assert data.state_dict()["features"] == ["x", "y", "z"]


@pytest.mark.parametrize("model", options("model"))
def test_every_sequence_model_reads_a_streamed_copy_from_config_alone(
    sequence_copy: Path, compose_config, model: str
) -> None:
    cfg = compose_config("data=streaming", f"data.input_dir={sequence_copy}", f"model={model}")
    augment_images_only(cfg.data)  # augmentation is for images
    data = build(cfg.data, "data")
    fill_in_from_data(cfg.data, data)  # what train.py does before it builds the model
    if "num_features" not in cfg.model.net:  # a net for images only: refused in one line
        with pytest.raises(UserError, match=r"reads images .*, e\.g\. model=lstm\.$") as error:
            check_model_reads_data(cfg)
        assert "\n" not in str(error.value)
        return
    assert cfg.model.net.image_shape is None and cfg.model.net.num_features == 3
    assert cfg.model.num_classes == 3 and cfg.data.max_length == 47
    data.setup("fit")
    steps, lengths, labels = next(iter(data.val_dataloader()))
    assert build(cfg.model, "model")(steps, lengths).shape == (len(labels), 3)


def test_data_settings_that_disagree_with_a_copy_of_sequences(sequence_copy: Path) -> None:
    for setting in ({"num_features": 2}, {"max_length": 10}, {"image_shape": [1, 8, 8]}):
        with pytest.raises(UserError, match=rf"^data\.{next(iter(setting))}=.* Leave data"):
            streamed_sequences(sequence_copy, **setting).setup("fit")
    crop = {"crop": v2.RandomCrop(size=[8, 8])}
    with pytest.raises(UserError, match=r"^data\.augment transforms images, .* holds sequences"):
        streamed_sequences(sequence_copy, augment=crop).setup("fit")


def test_a_split_smaller_than_one_batch_per_process_is_refused(sequence_copy: Path) -> None:
    """Several processes take whole batches only: a split smaller than one batch on each would
    train no step, or log no val/loss, and the run would end without its metric."""
    module = streamed_sequences(sequence_copy, batch_size=2000)
    module.trainer = SimpleNamespace(world_size=2)
    with pytest.raises(
        UserError, match=r"the \d+ train samples are fewer than one batch on each of 2"
    ):
        module.setup("fit")
    streamed_sequences(sequence_copy, batch_size=2000).setup("fit")  # one process: every sample


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["images", "sequences"])
def test_the_printed_train_command_trains_on_the_copy(
    kind: str, trained_by_printed_command
) -> None:
    """`prepare` ends with the command that trains on its copy; run as printed (two epochs on two
    processes for images, one for sequences), it trains and tests: a copy of sequences needs a
    sequence model, and the line names one."""
    result = trained_by_printed_command(kind)
    python, script, *_ = shlex.split(result.line.split("Train with: ")[1])
    assert (python, script) == ("python", "train.py")
    assert result.returncode == 0, result.output[-3000:]
    assert list(result.cwd.glob("logs/train/runs/*/results.yaml"))
