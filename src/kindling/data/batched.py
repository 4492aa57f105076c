"""What every kindling data module shares: a global batch size and its DataLoaders."""

import lightning as L
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, Dataset, Sampler

from kindling.utils.errors import UserError


def per_device_batch_size(batch_size: int, world_size: int) -> int:
    """Split a global batch size evenly over `world_size` processes."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        raise UserError(f"data.batch_size must be a whole number, got {batch_size!r}.")
    if batch_size <= 0:
        raise UserError(f"data.batch_size must be a positive integer, got {batch_size}.")
    if batch_size % world_size:
        raise UserError(
            f"data.batch_size={batch_size} is the global batch size and must divide evenly over "
            f"{world_size} processes. Use a multiple of {world_size}, "
            f"e.g. data.batch_size={max(world_size, batch_size // world_size * world_size)}."
        )
    return batch_size // world_size


class BatchedDataModule(L.LightningDataModule):
    """Serves `data_train`, `data_val` and `data_test` (set by a subclass's `setup`).

    Needs the hyperparameters `batch_size` (global: divided over the processes of a run),
    `num_workers`, `pin_memory` (used on CUDA only) and `persistent_workers`.
    """

    data_train: Dataset | None = None
    data_val: Dataset | None = None
    data_test: Dataset | None = None

    @property
    def batch_size_per_device(self) -> int:
        world_size = self.trainer.world_size if self.trainer is not None else 1
        return per_device_batch_size(self.hparams.batch_size, world_size)

    def _loader(
        self, dataset: Dataset | None, shuffle: bool = False, sampler: Sampler | None = None
    ) -> DataLoader:
        if dataset is None:
            raise RuntimeError("call setup() before asking for a data loader")
        on_cuda = self.trainer is not None and isinstance(self.trainer.accelerator, CUDAAccelerator)
        workers = self.hparams.num_workers
        distributed = self.trainer is not None and self.trainer.world_size > 1
        if sampler is None and not shuffle and distributed:
            # Evaluation sees every sample exactly once; the ranks' batch counts may differ by
            # one, which is safe: no evaluation step waits for the other ranks. (Lightning's own
            # DistributedSampler, which it keeps out when given this one, repeats samples.)
            sampler = UnrepeatedDistributedSampler(
                dataset,
                num_replicas=self.trainer.world_size,
                rank=self.trainer.global_rank,
                shuffle=False,
            )
        return DataLoader(
            dataset,
            batch_size=self.batch_size_per_device,
            shuffle=shuffle,
            sampler=sampler,
            num_workers=workers,
            pin_memory=self.hparams.pin_memory and on_cuda,
            persistent_workers=self.hparams.persistent_workers and workers > 0,
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader(self.data_train, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.data_val, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.data_test, shuffle=False)
