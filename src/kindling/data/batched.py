"""What every kindling data module shares: a global batch size and its DataLoaders."""

import os

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


def default_num_workers(processes_per_node: int) -> int:
    """DataLoader workers per process: the CPUs this process may run on, shared evenly by the
    processes of this machine (`sched_getaffinity` honours taskset, cgroups and SLURM)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cpus = os.cpu_count() or 1
    return max(1, cpus // max(1, processes_per_node))


class BatchedDataModule(L.LightningDataModule):
    """Serves `data_train`, `data_val` and `data_test` (set by a subclass's `setup`).

    Needs the hyperparameters `batch_size` (global: divided over the processes of a run),
    `num_workers` (null: `default_num_workers`), `pin_memory` (used on CUDA only) and
    `persistent_workers`; uses `prefetch_factor` and `drop_last` (training batches only) where
    a subclass has them.
    """

    data_train: Dataset | None = None
    data_val: Dataset | None = None
    data_test: Dataset | None = None
    # Which split `predict_dataloader` serves (`python -m kindling.predict input=test|val`).
    predict_split: str = "test"

    @property
    def batch_size_per_device(self) -> int:
        world_size = self.trainer.world_size if self.trainer is not None else 1
        return per_device_batch_size(self.hparams.batch_size, world_size)

    @property
    def num_workers(self) -> int:
        if self.hparams.num_workers is not None:
            return self.hparams.num_workers
        return default_num_workers(self.trainer.num_devices if self.trainer is not None else 1)

    def _loader(
        self,
        dataset: Dataset | None,
        shuffle: bool = False,
        sampler: Sampler | None = None,
        drop_last: bool = False,
    ) -> DataLoader:
        if dataset is None:
            raise RuntimeError("call setup() before asking for a data loader")
        on_cuda = self.trainer is not None and isinstance(self.trainer.accelerator, CUDAAccelerator)
        workers = self.num_workers
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
            prefetch_factor=self.hparams.get("prefetch_factor") if workers > 0 else None,
            drop_last=drop_last,
            # A data set whose samples do not stack (encoded files) brings its own.
            collate_fn=getattr(dataset, "collate", None),
        )

    def train_dataloader(self) -> DataLoader:
        # A last partial batch gives BatchNorm a tiny batch and torch.compile a new shape; kept
        # when the whole split is smaller than one global batch (no batch at all otherwise).
        drop = self.hparams.get("drop_last", False)
        if drop and len(self.data_train or ()) < self.hparams.batch_size:
            drop = False
        return self._loader(self.data_train, shuffle=True, drop_last=drop)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.data_val, shuffle=False)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.data_test, shuffle=False)

    def predict_dataloader(self) -> DataLoader:
        return self._loader(getattr(self, f"data_{self.predict_split}"), shuffle=False)
