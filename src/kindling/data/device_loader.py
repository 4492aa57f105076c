"""Batches of an in-memory data set that lives on the training device: no workers, no copies."""

from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch.utils.data import TensorDataset

from kindling import internals
from kindling.data.in_memory import BatchIndexedTensors
from kindling.data.loaders import resume_position


def fits_on_device(datamodule: L.LightningDataModule, share: float) -> bool:
    """Whether the three splits take at most `share` of the CUDA device's free memory, on every
    rank (all ranks must serve batches the same way, or their steps would not match)."""
    trainer = datamodule.trainer
    splits = (datamodule.data_train, datamodule.data_val, datamodule.data_test)
    size = sum(t.nbytes for split in splits if split is not None for t in split.tensors)
    free, _total = torch.cuda.mem_get_info(trainer.strategy.root_device)
    return trainer.strategy.reduce_boolean_decision(size <= share * free)


def serve_on_device(
    datamodule: L.LightningDataModule, dataset: BatchIndexedTensors, shuffle: bool
) -> "DeviceTensorLoader":
    """`dataset` copied once to this process's device, and served from there."""
    trainer = datamodule.trainer
    # Without the batch hooks: augmentation belongs to each training batch, not to the copy.
    tensors = move_data_to_device(dataset.tensors, trainer.strategy.root_device)
    return DeviceTensorLoader(
        tensors,
        datamodule.batch_size_per_device,
        shuffle=shuffle,
        # Training batches all have one shape: a last, smaller one would make torch.compile
        # compile again (and give BatchNorm a tiny batch); kept if it is the only one.
        drop_last=shuffle and len(dataset) >= datamodule.hparams.batch_size,
        rank=trainer.global_rank,
        world_size=trainer.world_size,
        seed=datamodule.shuffle_seed,
        # Training keeps the ranks in step; evaluation sees every sample exactly once.
        even_shards=shuffle,
    )


class DeviceTensorLoader:
    """Shuffle and slice tensors where they are (on the GPU, after one copy of the whole set).

    For data sets that fit in device memory (digits, MNIST, Fashion-MNIST, CIFAR-10), this
    replaces a DataLoader: each batch is an index into tensors already on the device, so no
    step waits for a host-to-device copy or a worker process.

    With several processes, every rank draws the same permutation (seeded by `seed` and the
    epoch) and takes every `world_size`-th index from `rank` on, like `DistributedSampler`.
    With `even_shards` (training) the tail that does not divide evenly is dropped, so that all
    ranks run the same steps; without (evaluation), every sample is served exactly once and the
    ranks' shares differ by at most one sample.

    Like torchdata's `StatefulDataLoader`, it has a `state_dict` (the epoch and the samples of it
    all ranks have consumed) that Lightning saves in checkpoints: a run resumed mid-epoch serves
    the rest of that epoch's permutation, dealt over the ranks it has, as many as the saving
    run's or not. A saved position applies to its own epoch only.
    """

    def __init__(
        self,
        tensors: tuple[torch.Tensor, ...],
        batch_size: int,
        shuffle: bool = False,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        even_shards: bool = True,
    ):
        self.tensors = tensors
        self.dataset = TensorDataset(*tensors)  # as on a DataLoader, for callbacks that read it
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.rank, self.world_size = rank, world_size
        self.seed = seed
        self.epoch = 0
        # Lightning calls `loader.sampler.set_epoch(epoch)` at the start of every epoch, as it
        # does for a DistributedSampler: a resumed run shuffles like an uninterrupted one.
        internals.check_sampler_epoch()
        self.sampler = self
        self.batch_sampler = None  # read by Lightning's checks, as on a DataLoader
        self.even_shards = even_shards
        size = len(tensors[0])
        # Samples per rank.
        self.num_samples = size // world_size if even_shards else len(range(rank, size, world_size))
        self.consumed = 0  # samples of this epoch, all ranks' together
        self._resume_at: tuple[int, int] | None = None  # (epoch, consumed) of a loaded state

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def state_dict(self) -> dict[str, Any]:
        return {"seed": self.seed, "epoch": self.epoch, "consumed": self.consumed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.seed = state["seed"]
        if "consumed" in state:
            consumed = state["consumed"]
        else:  # older checkpoints count this rank's batches: they resume on as many ranks
            consumed = state["served"] * self.batch_size * self.world_size
        self._resume_at = (state["epoch"], resume_position(consumed, self.world_size))

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        device = self.tensors[0].device
        size = len(self.tensors[0])
        total = self.num_samples * self.world_size if self.even_shards else size
        if self.shuffle:
            # Not `seed + epoch`: seed 1's second epoch would be seed 2's first.
            generator = torch.Generator(device=device).manual_seed((self.seed << 20) + self.epoch)
            order = torch.randperm(size, device=device, generator=generator)
        else:
            order = torch.arange(size, device=device)
        start = 0
        if self._resume_at is not None and self._resume_at[0] == self.epoch:
            start = self._resume_at[1]
        self._resume_at = None
        self.consumed = start
        # Dealt one each in turn: after k batches on every rank, the first
        # start + k * batch_size * world_size of the order are consumed.
        mine = order[start:total][self.rank :: self.world_size]
        end = len(mine) - len(mine) % self.batch_size if self.drop_last else len(mine)
        for first in range(0, end, self.batch_size):
            index = mine[first : first + self.batch_size]
            self.consumed += self.batch_size * self.world_size
            yield tuple(t[index] for t in self.tensors)
