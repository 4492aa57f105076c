"""Batches of an in-memory data set that lives on the training device: no workers, no copies."""

from collections.abc import Iterator

import lightning as L
import torch
from lightning.fabric.utilities.apply_func import move_data_to_device
from torch.utils.data import TensorDataset

from kindling import internals
from kindling.data.loaders import EpochPosition

# data.on_device=auto: the share of the device's free memory the whole data set may take.
ON_DEVICE_SHARE = 0.25


def serve_on_device(
    datamodule: L.LightningDataModule, dataset: TensorDataset, shuffle: bool
) -> "DeviceTensorLoader | None":
    """`dataset` copied once to this process's device (without the batch hooks: augmentation
    belongs to each training batch), and served from there; None where `on_device=auto` finds
    the splits too large (decided once, on every rank alike)."""
    trainer = datamodule.trainer
    if datamodule._on_device is None:
        datamodule._on_device = datamodule.hparams.on_device is True
        if not datamodule._on_device:  # `auto`, on CUDA
            splits = (datamodule.data_train, datamodule.data_val, datamodule.data_test)
            size = sum(t.nbytes for split in splits if split is not None for t in split.tensors)
            free, _total = torch.cuda.mem_get_info(trainer.strategy.root_device)
            # All ranks must serve batches the same way, or their steps would not match.
            fits = size <= ON_DEVICE_SHARE * free
            datamodule._on_device = trainer.strategy.reduce_boolean_decision(fits)
    if not datamodule._on_device:
        return None
    return DeviceTensorLoader(
        move_data_to_device(dataset.tensors, trainer.strategy.root_device),
        datamodule.batch_size_per_device,
        shuffle=shuffle,
        # As SplitDataModule.train_dataloader drops it, and for the same reasons.
        drop_last=shuffle and len(dataset) >= datamodule.hparams.batch_size,
        rank=trainer.global_rank,
        world_size=trainer.world_size,
        seed=datamodule.shuffle_seed,
    )


class DeviceTensorLoader(EpochPosition):
    """Shuffle and slice tensors where they are, in place of a DataLoader: each batch is an
    index into tensors already on the device, so no step waits for a copy or a worker.

    Every rank draws the same permutation (seeded by `seed` and the epoch) and takes every
    `world_size`-th index from `rank` on, like `DistributedSampler`. Shuffled (training), it
    drops the tail that does not divide evenly, so all ranks run the same steps; in order
    (evaluation), every sample is served once. Its `state_dict` (`EpochPosition`) is saved in
    checkpoints as a `StatefulDataLoader`'s is.
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
    ):
        self.dataset = TensorDataset(*tensors)  # as on a DataLoader, for callbacks that read it
        self.batch_size, self.shuffle, self.drop_last = batch_size, shuffle, drop_last
        self.rank, self.world_size, self.processes = rank, world_size, world_size
        self.served_unit = batch_size * world_size  # an older state counts this rank's batches
        self.seed, self.epoch = seed, 0
        # Lightning calls `loader.sampler.set_epoch(epoch)` every epoch, as for a
        # DistributedSampler: a resumed run shuffles like an uninterrupted one.
        internals.check_sampler_epoch()
        self.sampler = self
        self.batch_sampler = None  # read by Lightning's checks, as on a DataLoader
        size = len(tensors[0])
        self.num_samples = size // world_size if shuffle else len(range(rank, size, world_size))

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, ...]]:
        tensors = self.dataset.tensors
        device, size = tensors[0].device, len(tensors[0])
        if self.shuffle:
            # Not `seed + epoch`: seed 1's second epoch would be seed 2's first.
            generator = torch.Generator(device=device).manual_seed((self.seed << 20) + self.epoch)
            order = torch.randperm(size, device=device, generator=generator)
        else:
            order = torch.arange(size, device=device)
        total = self.num_samples * self.world_size if self.shuffle else size
        # Dealt one each in turn: after k batches on every rank, the first
        # start + k * batch_size * world_size of the order are consumed.
        mine = order[self.start() : total][self.rank :: self.world_size]
        end = len(mine) - len(mine) % self.batch_size if self.drop_last else len(mine)
        for first in range(0, end, self.batch_size):
            index = mine[first : first + self.batch_size]
            self.consumed += self.batch_size * self.world_size
            yield tuple(t[index] for t in tensors)
