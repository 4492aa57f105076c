"""Training-time augmentation: per-image crops and flips on whole batches, and the config group."""

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from torchvision.transforms import v2

from kindling.data.augment import (
    BatchAugment,
    DeviceGenerator,
    random_crop,
    random_horizontal_flip,
    worker_transform,
)
from kindling.errors import UserError

from helpers import digits


def images(batch: int = 64, size: int = 8) -> torch.Tensor:
    return torch.arange(batch * 2 * size * size, dtype=torch.float32).view(batch, 2, size, size)


def generator(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_flip_draws_for_each_image() -> None:
    batch = images()
    flipped = random_horizontal_flip(batch, 0.5, generator())
    mirrored = [torch.equal(f, b.flip(-1)) for f, b in zip(flipped, batch, strict=True)]
    unchanged = [torch.equal(f, b) for f, b in zip(flipped, batch, strict=True)]
    assert all(m != u for m, u in zip(mirrored, unchanged, strict=True))
    assert 16 < sum(mirrored) < 48  # some of each, not one draw for all
    assert torch.equal(random_horizontal_flip(batch, 0.0, generator()), batch)
    assert torch.equal(random_horizontal_flip(batch, 1.0, generator()), batch.flip(-1))


def test_crop_is_a_window_of_each_padded_image_at_its_own_offset() -> None:
    batch = images()
    crops = random_crop(batch, (8, 8), [2, 2, 2, 2], fill=-1.0, generator=generator())
    assert crops.shape == batch.shape
    padded = F.pad(batch, (2, 2, 2, 2), value=-1.0)
    offsets = set()
    for crop, image in zip(crops, padded, strict=True):
        found = [
            (y, x)
            for y in range(5)
            for x in range(5)
            if torch.equal(image[:, y : y + 8, x : x + 8], crop)
        ]
        assert len(found) == 1
        offsets.add(found[0])
    assert len(offsets) > 10  # drawn per image
    # Without padding, an image-sized crop is the image.
    assert torch.equal(random_crop(batch, (8, 8), None, 0.0, generator()), batch)


def test_draws_repeat_with_the_seed_and_epoch_and_differ_by_rank() -> None:
    augment = BatchAugment({"crop": v2.RandomCrop(8, padding=2), "flip": v2.RandomHorizontalFlip()})
    batch = images()
    cpu = torch.device("cpu")

    def draw(epoch: int, rank: int, seed: int = 0) -> torch.Tensor:
        return augment(batch, DeviceGenerator(seed)(cpu, epoch, rank))

    assert torch.equal(draw(0, 0), draw(0, 0))
    assert not torch.equal(draw(0, 0), draw(1, 0))
    assert not torch.equal(draw(0, 0), draw(0, 1))
    assert not torch.equal(draw(0, 0), draw(0, 0, seed=1))
    # One generator carries on within an epoch and starts again at the next.
    generators = DeviceGenerator(0)
    first = augment(batch, generators(cpu, 0, 0))
    assert not torch.equal(augment(batch, generators(cpu, 0, 0)), first)
    assert not torch.equal(augment(batch, generators(cpu, 1, 0)), first)


def test_policies_that_need_workers_are_refused_for_in_memory_sets() -> None:
    with pytest.raises(UserError, match=r"augment.policy \(TrivialAugmentWide\) runs on image"):
        BatchAugment({"policy": v2.TrivialAugmentWide()})
    assert not BatchAugment(None) and not BatchAugment({"flip": None})
    assert worker_transform({"flip": None}) is None


def test_in_memory_training_batches_are_augmented_and_others_are_not(tmp_path: Path) -> None:
    dm = digits(tmp_path, batch_size=32, augment={"crop": v2.RandomCrop(8, padding=1)})
    batch = next(iter(dm.train_dataloader()))
    dm.trainer = SimpleNamespace(training=False, current_epoch=0, global_rank=0)
    assert dm.on_after_batch_transfer(batch, 0) is batch
    dm.trainer.training = True
    augmented, labels = dm.on_after_batch_transfer(batch, 0)
    assert labels is batch[1] and augmented.shape == batch[0].shape
    assert not torch.equal(augmented, batch[0])
    # The padding is black (the smallest standardised value), not the mean.
    black = float(dm.standardise(torch.zeros(1, 1, 1, 1)))
    shifted = [i for i in range(32) if not torch.equal(augmented[i], batch[0][i])]
    moved = augmented[shifted]
    edges = torch.cat([moved[:, :, 0], moved[:, :, -1], moved[:, :, :, 0], moved[:, :, :, -1]])
    assert torch.isclose(edges, torch.tensor(black)).any()
    assert edges.min() >= black - 1e-5


# The config group: each data set's default, and each option built.


def test_each_data_set_has_a_fitting_default(compose_config) -> None:
    assert set(compose_config("data=cifar10").data.augment) == {"crop", "flip"}
    assert set(compose_config("data=fashion_mnist").data.augment) == {"crop", "flip"}
    # A mirrored digit is another symbol: no flip. The 8x8 digits measured no better with crops.
    assert set(compose_config("data=mnist").data.augment) == {"crop"}
    assert not compose_config("data=digits").data.augment
    assert compose_config("data=cifar10").data.augment.crop.padding == 4
    assert compose_config("data=mnist").data.augment.crop.padding == 3
    assert compose_config("data=digits", "data/augment=crop").data.augment.crop.padding == 1
    assert not compose_config("data/augment=none").data.augment
    assert "augment" not in compose_config("experiment=charlm").data


@pytest.mark.parametrize("option", ["none", "crop", "flip_crop"])
def test_options_build_for_in_memory_sets(compose_config, option: str) -> None:
    cfg = compose_config("data=digits", f"data/augment={option}")
    dm = instantiate(cfg.data, _convert_="all")
    transforms = dm.batch_augment.transforms if dm.batch_augment else []
    assert len(transforms) == {"none": 0, "crop": 1, "flip_crop": 2}[option]


def test_trivial_augment_on_digits_is_a_user_error(compose_config) -> None:
    cfg = compose_config("data=digits", "data/augment=trivial_augment")
    with pytest.raises(Exception) as error:
        instantiate(cfg.data, _convert_="all")
    assert "runs on image folders only" in str(error.value)


def test_trivial_augment_runs_per_image_on_uint8(compose_config, tmp_path: Path) -> None:
    (tmp_path / "a" / "x").mkdir(parents=True)
    cfg = compose_config(
        "data=image_folder", f"data.path={tmp_path / 'a'}", "data/augment=trivial_augment"
    )
    dm = instantiate(cfg.data, _convert_="all")
    assert v2.TrivialAugmentWide in [type(t) for t in dm.transform.transforms]
    image = torch.randint(0, 256, (3, 64, 64), dtype=torch.uint8)
    torch.manual_seed(0)
    outs = [dm.transform(image) for _ in range(5)]  # an operation drawn for each call
    assert all(out.dtype == torch.uint8 and out.shape == image.shape for out in outs)
    assert sum(not torch.equal(out, image) for out in outs) >= 2


@pytest.mark.parametrize("on_device", [False, True])
def test_the_trainer_augments_training_batches_only(
    compose_config, monkeypatch, on_device: bool
) -> None:
    from kindling.train import run

    calls = []
    original = BatchAugment.__call__

    def spy(self, images, generator, fill=0.0):
        calls.append(images.shape)
        return original(self, images, generator, fill)

    monkeypatch.setattr(BatchAugment, "__call__", spy)
    quiet = ["callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null"]
    cfg = compose_config("data/augment=crop", f"data.on_device={on_device}", "debug=fdr", *quiet)
    run(cfg)
    # fast_dev_run: one training, one validation and one test batch; only the first augmented.
    assert calls == [(64, 1, 8, 8)]
