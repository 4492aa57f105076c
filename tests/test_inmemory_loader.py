"""In-memory data sets: whole batches by one index, on the device when it has room, one shape
for every training batch there."""

from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from kindling.data.device_loader import DeviceTensorLoader
from kindling.data.digits import DigitsDataModule
from kindling.data.in_memory import BatchIndexedTensors
from kindling.errors import UserError

from helpers import digits


def test_batch_indexing_serves_what_per_sample_loading_serves() -> None:
    images, labels = torch.randn(50, 1, 4, 4), torch.arange(50)
    order = torch.randperm(50, generator=torch.Generator().manual_seed(0)).tolist()
    fetched: list[list[int]] = []

    class Recording(BatchIndexedTensors):
        def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
            fetched.append(indices)
            return super().__getitems__(indices)

    indexed = Recording(images, labels)
    batched = DataLoader(indexed, batch_size=16, sampler=order, collate_fn=indexed.collate)
    per_sample = DataLoader(TensorDataset(images, labels), batch_size=16, sampler=order)
    for (x, y), (x_ref, y_ref) in zip(batched, per_sample, strict=True):
        assert torch.equal(x, x_ref) and torch.equal(y, y_ref)
    assert [len(indices) for indices in fetched] == [16, 16, 16, 2]  # one call per batch
    assert torch.equal(indexed[3][0], images[3])  # one sample still works


def test_on_device_training_batches_all_have_one_shape(tmp_path: Path) -> None:
    # 1,294 training images in batches of 100: the last 94 are left out of training (a new
    # shape would make torch.compile compile again), never out of evaluation.
    dm = digits(tmp_path, on_device=True)
    train = dm.train_dataloader()
    assert isinstance(train, DeviceTensorLoader)
    assert {tuple(images.shape) for images, _ in train} == {(100, 1, 8, 8)}
    assert len(train) == len(dm.data_train) // 100
    val = dm.val_dataloader()
    assert sum(len(labels) for _, labels in val) == len(dm.data_val)


def test_on_device_auto_keeps_cpu_runs_on_the_dataloader(tmp_path: Path) -> None:
    dm = digits(tmp_path)  # on_device=auto, the default
    assert dm.hparams.on_device == "auto"
    assert not isinstance(dm.train_dataloader(), DeviceTensorLoader)
    with pytest.raises(UserError, match=r"data\.on_device must be true, false or auto"):
        DigitsDataModule(str(tmp_path), 10, [1, 8, 8], on_device="yes")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_device_auto_holds_a_small_set_on_the_gpu(tmp_path: Path) -> None:
    dm = digits(tmp_path, accelerator="gpu")
    train = dm.train_dataloader()
    assert isinstance(train, DeviceTensorLoader)
    assert train.dataset.tensors[0].is_cuda


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize(("spare", "on_device"), [(0, True), (-1, False)], ids=["fits", "over"])
def test_on_device_auto_takes_a_quarter_of_free_gpu_memory_at_most(
    tmp_path: Path, monkeypatch, spare: int, on_device: bool
) -> None:
    dm = digits(tmp_path, accelerator="gpu")
    splits = (dm.data_train, dm.data_val, dm.data_test)
    size = sum(t.nbytes for split in splits for t in split.tensors)
    # Free memory of four times the set fits it; a byte less, and a large set, do not.
    free = 4 * size + spare
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free, 80 * 2**30))
    train = dm.train_dataloader()
    images, _labels = next(iter(train))
    assert isinstance(train, DeviceTensorLoader) == on_device
    assert images.is_cuda == on_device  # else a DataLoader of CPU tensors, which Lightning moves
