"""Training on a folder of image files: layouts, uint8 batches, statistics, bad input, predict."""

import csv
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from omegaconf import open_dict
from torch.utils.data import DataLoader
from torchvision.transforms import v2

from kindling.data.image_folder import STATISTICS_FILE, ImageFiles, decode_batch, read_image
from kindling.errors import UserError
from kindling.predict import PredictArgs, predict
from kindling.train import run

from helpers import (
    COLOURS,
    QUIET,
    datamodule,
    make_folder,
    train_py_here,
    write_image,
)


def test_one_folder_is_split_into_train_val_test(tmp_path: Path) -> None:
    dm = datamodule(make_folder(tmp_path / "images", per_class=10))
    dm.setup("fit")
    assert dm.classes == ["blue", "green", "red"]
    sizes = len(dm.data_train), len(dm.data_val), len(dm.data_test)
    assert sizes == (24, 3, 3)
    files = [{f for f, _ in d.samples} for d in (dm.data_train, dm.data_val, dm.data_test)]
    assert not (files[0] & files[1]) and not (files[0] & files[2]) and not (files[1] & files[2])
    # Seeded: the same split again.
    again = datamodule(tmp_path / "images")
    again.setup("fit")
    assert again.data_val.samples == dm.data_val.samples


def test_given_splits_are_used_and_an_absent_one_carved(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", per_class=5, splits=("train", "test"))
    dm = datamodule(root)
    dm.setup("fit")
    assert all("/test/" in str(f) for f, _ in dm.data_test.samples)
    assert len(dm.data_test) == 15 and len(dm.data_train) + len(dm.data_val) == 15
    assert all("/train/" in str(f) for f, _ in dm.data_val.samples)


def test_batches_are_uint8_and_standardised_after_transfer(tmp_path: Path) -> None:
    dm = datamodule(make_folder(tmp_path / "images"))
    dm.setup("fit")
    images, labels = next(iter(dm.val_dataloader()))
    assert images.dtype == torch.uint8 and images.shape == (2, 3, 8, 8)
    assert labels.dtype == torch.int64
    model_input, same_labels = dm.on_after_batch_transfer((images, labels), 0)
    assert model_input.dtype == torch.float32 and same_labels is labels
    expected = (images.float() / 255 - dm.mean) / dm.std
    torch.testing.assert_close(model_input, expected)
    # The model summary's example input passes through untouched.
    example = torch.zeros(1, 3, 8, 8)
    assert dm.on_after_batch_transfer(example, 0) is example


def test_statistics_are_measured_on_train_cached_and_reused(tmp_path: Path, monkeypatch) -> None:
    root = make_folder(tmp_path / "images", splits=("train",))
    for split in ("val", "test"):  # near-white: statistics measured on them would show it
        for name in COLOURS:
            write_image(root / split / name / "0.png", (255, 255, 255))
    dm = datamodule(root)
    dm.setup("fit")
    cached = json.loads((root / STATISTICS_FILE).read_text())
    (entry,) = cached.values()
    assert entry["mean"] == pytest.approx(dm.mean.flatten().tolist())
    # Mostly red, green and blue in equal parts: every channel's mean is well inside (0, 1).
    assert all(0.2 < m < 0.6 for m in entry["mean"])

    def fail(*args, **kwargs):
        raise AssertionError("statistics measured again instead of read from the cache")

    monkeypatch.setattr("kindling.data.image_folder.channel_statistics", fail)
    again = datamodule(root)
    again.setup("fit")
    torch.testing.assert_close(again.mean, dm.mean)


def test_statistics_given_in_config(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images")
    dm = datamodule(root, mean=[0.5, 0.5, 0.5], std=[0.25, 0.25, 0.25])
    dm.setup("fit")
    assert dm.mean.flatten().tolist() == [0.5] * 3 and dm.std.flatten().tolist() == [0.25] * 3
    assert not (root / STATISTICS_FILE).exists()
    with pytest.raises(UserError, match="one per channel"):
        datamodule(root, channels=1, image_shape=None, mean=[0.5] * 3, std=[0.2] * 3).setup()


def test_mixed_sizes_and_modes_are_resized_and_converted(tmp_path: Path) -> None:
    root = tmp_path / "images"
    modes = ["RGB", "L", "RGBA", "P", "CMYK"]
    for name, colour in COLOURS.items():
        for i, mode in enumerate(modes):
            suffix = ".jpg" if mode in ("L", "CMYK") else ".png"
            write_image(root / name / f"{i}{suffix}", colour, size=(5 + 7 * i, 9), mode=mode)
        write_image(root / name / "old.bmp", colour, size=(3, 3))  # decoded by PIL
    for channels in (3, 1):
        dm = datamodule(root, channels=channels, batch_size=18, drop_last=False)
        dm.setup("fit")
        images, _ = next(iter(dm.train_dataloader()))
        assert images.shape[1:] == (channels, 8, 8) and images.dtype == torch.uint8
        # Every file was decoded: none was skipped as unreadable and replaced by another.
        assert not dm.data_train.reported
        for path in root.glob("*/*"):  # every image of every class
            assert read_image(path, channels, 8).shape == (channels, 8, 8), path


def test_training_transforms_run_in_the_workers_and_eval_has_none(tmp_path: Path) -> None:
    flip = {"flip": v2.RandomHorizontalFlip(p=1.0)}
    dm = datamodule(make_folder(tmp_path / "images"), augment=flip, num_workers=2)
    dm.setup("fit")
    plain = datamodule(tmp_path / "images")
    plain.setup("fit")
    loader = dm.train_dataloader()
    assert loader.num_workers == 2 and loader.persistent_workers and loader.prefetch_factor == 2
    assert loader.drop_last
    index = 0
    image, _ = dm.data_train[index]
    torch.testing.assert_close(image, plain.data_train[index][0].flip(-1))
    torch.testing.assert_close(dm.data_val[0][0], plain.data_val[0][0])
    batches = list(loader)  # decoded by two worker processes
    assert sum(len(labels) for _, labels in batches) == len(dm.data_train) // 4 * 4


def test_default_workers_follow_the_cpus_of_this_process(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(8)), raising=False)
    dm = datamodule(tmp_path, num_workers=None)
    assert dm.num_workers == 8
    dm.trainer = SimpleNamespace(num_devices=2)
    assert dm.num_workers == 4


# Bad input: one short message that names the path and the fix.


def test_missing_path(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"data.path=.*nowhere does not exist\. Point data.path"):
        datamodule(tmp_path / "nowhere").setup()


def test_folder_without_class_subfolders(tmp_path: Path) -> None:
    write_image(tmp_path / "images" / "a.png", (1, 2, 3))
    with pytest.raises(UserError, match=r"images has no class subfolders\. Put each class"):
        datamodule(tmp_path / "images").setup()


def test_class_folder_without_images(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images")
    (root / "empty").mkdir()
    (root / "empty" / "notes.txt").write_text("no images here")
    with pytest.raises(UserError, match=r"Class folder .*empty has no image files.*remove the"):
        datamodule(root, num_classes=4).setup()


def test_non_image_files_are_skipped_and_counted_once(tmp_path: Path, caplog) -> None:
    root = make_folder(tmp_path / "images")
    for i, name in enumerate(COLOURS):
        (root / name / f"notes{i}.txt").write_text("not an image")
    (root / "red" / "Thumbs.db").write_bytes(b"\0")
    dm = datamodule(root)
    with caplog.at_level(logging.INFO):
        dm.setup()
    lines = [r.getMessage() for r in caplog.records if "not images" in r.getMessage()]
    assert lines == [f"Skipped 4 files under {root} that are not images (by suffix)."]
    assert len(dm.data_train) + len(dm.data_val) + len(dm.data_test) == 18


def test_num_classes_disagreeing_with_the_folders(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"num_classes=5 but .* has 3 class folders.*=3"):
        datamodule(make_folder(tmp_path / "images"), num_classes=5).setup()


def test_val_class_that_train_does_not_have(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", splits=("train", "val"))
    write_image(root / "val" / "purple" / "0.png", (200, 0, 200))
    with pytest.raises(UserError, match=r"val has class folders that .*train does not: purple"):
        datamodule(root).setup()


def corrupt_files(root: Path) -> tuple[Path, Path]:
    """A PNG cut short and a 'JPEG' that is text."""
    truncated = root / "red" / "truncated.png"
    truncated.write_bytes((root / "red" / "1.png").read_bytes()[:60])
    fake = root / "blue" / "fake.jpg"
    fake.write_text("this is not a JPEG")
    return truncated, fake


def test_unreadable_images_refused_before_training_with_check(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images")
    truncated, fake = corrupt_files(root)
    with pytest.raises(UserError) as error:
        datamodule(root, unreadable="check").setup()
    message = str(error.value)
    assert "2 image files cannot be decoded" in message
    assert str(truncated) in message and str(fake) in message
    assert "data.unreadable=skip" in message


def test_unreadable_images_skipped_with_a_warning(tmp_path: Path, caplog) -> None:
    root = make_folder(tmp_path / "images")
    truncated, fake = corrupt_files(root)
    dm = datamodule(
        root, val_fraction=0.01, test_fraction=0.01, mean=[0.5] * 3, std=[0.2] * 3,
        drop_last=False,  # every file is read: none falls in a dropped last batch
    )  # fmt: skip
    dm.setup()
    with caplog.at_level(logging.WARNING):
        images = [image for loader in (dm.train_dataloader(),) for image, _ in loader]
        images += [image for image, _ in dm.val_dataloader()] + [i for i, _ in dm.test_dataloader()]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert str(truncated) in warned and str(fake) in warned
    # Every batch is whole: the bad files were replaced by readable ones.
    assert all(batch.shape[1:] == (3, 8, 8) for batch in images)


def test_checkpoint_classes_must_match_the_folder(tmp_path: Path) -> None:
    dm = datamodule(make_folder(tmp_path / "images"))
    dm.setup()
    state = dm.state_dict() | {"classes": ["cat", "dog", "emu"]}
    with pytest.raises(UserError, match=r"has the classes blue, green, red, but the checkpoint"):
        dm.load_state_dict(state)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message without CUDA")
def test_cuda_decode_without_cuda_is_a_user_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match=r"decode_device=cuda .* Use data.decode_device=cpu"):
        datamodule(tmp_path, decode_device="cuda")


def test_gpu_decode_path_decodes_like_the_workers(tmp_path: Path) -> None:
    """The decode_device=cuda path, run on the CPU where there is no GPU."""
    root = make_folder(tmp_path / "images", per_class=2)
    write_image(root / "red" / "old.bmp", COLOURS["red"], size=(3, 3))  # decoded by PIL
    samples = [(root / "red" / name, 2) for name in ("0.jpg", "1.png", "old.bmp")]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    for channels in (3, 1):
        encoded = ImageFiles(samples, channels, 8, encoded=True)
        data, labels = zip(*encoded.collate([encoded[i] for i in range(3)]), strict=True)
        images = decode_batch(data, device, channels=channels, size=8)
        assert images.shape == (3, channels, 8, 8) and images.dtype == torch.uint8
        assert list(labels) == [2, 2, 2]
        for image, (path, _) in zip(images.cpu(), samples, strict=True):
            # nvJPEG and libjpeg-turbo may round differently: within a few levels.
            assert (image.int() - read_image(path, channels, 8).int()).abs().max() <= 8
    # The bytes cross from a worker process to the training one.
    loader = DataLoader(encoded, 3, num_workers=1, collate_fn=encoded.collate, timeout=60)
    assert [len(data) for data, _ in next(iter(loader))] == [p.stat().st_size for p, _ in samples]


# End to end: python train.py data=image_folder, then predict with class names.


@pytest.fixture
def trained(compose_config, tmp_path: Path) -> tuple[Path, Path]:
    root = make_folder(tmp_path / "images", per_class=8)
    cfg = compose_config(
        "data=image_folder", f"data.path={root}", "data.image_size=8", "data.batch_size=8",
        "data.num_workers=0", "trainer=cpu", "trainer.max_epochs=3", *QUIET,
    )  # fmt: skip
    run(cfg)
    assert cfg.data.num_classes == 3  # counted from the folders, written into the run's config
    return root, Path(cfg.paths.output_dir) / "checkpoints" / "last.ckpt"


@pytest.mark.slow
def test_trains_tests_from_the_checkpoint_and_predicts_class_names(
    trained, compose_config, tmp_path: Path, caplog
) -> None:
    root, checkpoint = trained
    saved = torch.load(checkpoint, weights_only=True)
    assert saved["ImageFolderDataModule"]["classes"] == ["blue", "green", "red"]

    # train=false tests the checkpoint on the folder, in a run folder of its own.
    cfg = compose_config(
        "data=image_folder", f"data.path={root}", "data.image_size=8", "data.num_workers=0",
        "trainer=cpu", "train=false", f"ckpt_path={checkpoint}", *QUIET,
    )  # fmt: skip
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path / "tested")
    run(cfg)
    with open(tmp_path / "tested" / "csv" / "metrics.csv") as f:
        (tested,) = [row for row in csv.DictReader(f) if row.get("test/acc")]
    assert float(tested["test/acc"]) > 0.5  # three colours: chance is 1/3

    # Five good PNGs, one corrupt PNG and a text file.
    folder = tmp_path / "new"
    for i, name in enumerate(["red", "red", "green", "blue", "blue"]):
        write_image(folder / f"{i}_{name}.png", COLOURS[name], seed=100 + i)
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    (folder / "notes.txt").write_text("not an image")
    with caplog.at_level(logging.WARNING):
        output = predict(
            PredictArgs(str(checkpoint), str(folder), str(tmp_path / "p.csv"), num_workers=0)
        )
    with open(output) as f:
        rows = list(csv.DictReader(f))
    assert [Path(r["file"]).name for r in rows] == [f"{i}_{n}.png" for i, n in
                                                    enumerate(["red", "red", "green", "blue",
                                                               "blue"])]  # fmt: skip
    assert [r["class"] for r in rows] == ["red", "red", "green", "blue", "blue"]
    assert "broken.png" in caplog.text and "1 of 6 files could not be decoded" in caplog.text

    # input=test predicts the folder's own test split, named by file.
    output = predict(PredictArgs(str(checkpoint), "test", str(tmp_path / "t.csv"), num_workers=0))
    with open(output) as f:
        rows = list(csv.DictReader(f))
    assert rows and all(Path(r["file"]).parent.name == r["class"] for r in rows)


@pytest.mark.slow
def test_a_multirun_trains_with_and_without_augmentation(tmp_path: Path) -> None:
    root = make_folder(tmp_path / "images", per_class=4)
    result = train_py_here(
        "-m", "data=image_folder", f"data.path={root}", "data.image_size=8", "data.batch_size=4",
        "data.num_workers=1", "data/augment=none,flip_crop", "trainer=cpu",
        "trainer.max_epochs=1", *QUIET, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    runs = sorted((tmp_path / "logs").rglob("metrics.csv"))
    assert len(runs) == 2
    configs = [(path.parents[1] / ".hydra" / "config.yaml").read_text() for path in runs]
    assert sum("RandomHorizontalFlip" in config for config in configs) == 1
    for path in runs:
        assert "test/acc" in path.read_text()


def test_a_missing_data_path_names_the_key(compose_config) -> None:
    from kindling.config.instantiate import build
    from kindling.errors import find_user_error

    cfg = compose_config("data=image_folder")
    with pytest.raises(Exception) as error:
        build(cfg.data, "data")
    assert "needs the folder of your images: data.path=<folder>" in str(
        find_user_error(error.value)
    )
