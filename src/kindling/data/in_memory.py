"""Images held in memory as tensors (digits, the torchvision sets), a batch by one index."""

from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from torch.utils.data import DataLoader, Dataset, TensorDataset

from kindling.data.loaders import SplitDataModule, split_off
from kindling.errors import UserError

Split = tuple[torch.Tensor, torch.Tensor]  # images (N, C, H, W) float in [0, 1], labels (N,) int64


class BatchIndexedTensors(TensorDataset):
    """Tensors whose batches are taken with one index per tensor: torch's fetcher hands
    `__getitems__` all the indices of a batch, and `collate` passes the result through."""

    def __getitems__(self, indices: list[int]) -> tuple[torch.Tensor, ...]:
        index = torch.as_tensor(indices)
        return tuple(tensor[index] for tensor in self.tensors)

    @staticmethod
    def collate(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        return batch


class InMemoryImageDataModule(SplitDataModule):
    """Images held in memory as tensors, standardised per channel with training-set statistics.

    Subclasses implement `load_splits`; this class holds out validation (`split_off`)
    and serves the splits. Its arguments are configs/data/_base/in_memory_image.yaml's keys.
    `on_device`: batches served from the training device (`DeviceTensorLoader`); `augment`:
    crops and flips of whole training batches there, a draw per image (kindling.data.augment).
    """

    def __init__(
        self,
        data_dir: str,
        num_classes: int,
        image_shape: Sequence[int],
        batch_size: int = 64,
        val_fraction: float = 0.1,
        num_workers: int = 0,
        pin_memory: bool = True,
        persistent_workers: bool = True,
        seed: int = 0,
        on_device: bool | str = "auto",
        shuffle_seed: int | None = None,
        augment: Mapping[str, Callable[[torch.Tensor], torch.Tensor] | None] | None = None,
        folds: int | None = None,
        fold: int | None = None,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["augment"])
        self.batch_augment = self.generator = None
        if any(t is not None for t in (augment or {}).values()):
            from kindling.data.augment import BatchAugment, DeviceGenerator  # only when augmenting

            self.batch_augment = BatchAugment(augment)
            self.generator = DeviceGenerator(torch.initial_seed())
        self._fill: torch.Tensor | None = None
        if on_device not in (True, False, "auto"):
            raise UserError(f"data.on_device must be true, false or auto, got {on_device!r}.")
        self._on_device: bool | None = None  # `on_device` decided, once the trainer is known
        self.mean: torch.Tensor | None = None  # of the training split, saved in checkpoints
        self.std: torch.Tensor | None = None

    @abstractmethod
    def load_splits(self) -> tuple[Split, Split]:
        """`(train, test)`."""

    def inputs_to_predict(self, path: str) -> tuple[Dataset, list[str]]:
        from kindling.data.image_folder import files_to_predict  # image files

        return files_to_predict(path, *self.hparams.image_shape[:2])

    def setup_splits(self) -> None:
        (train_images, train_labels), (test_images, test_labels) = self.load_splits()
        hp, name = self.hparams, type(self).__name__
        if tuple(train_images.shape[1:]) != tuple(hp.image_shape):
            raise UserError(
                f"{name}: images have shape {tuple(train_images.shape[1:])} but the data config "
                f"says image_shape={list(hp.image_shape)}. Fix data.image_shape."
            )
        if int(train_labels.max()) >= hp.num_classes:
            raise UserError(
                f"{name}: found label {int(train_labels.max())} but the data config says "
                f"num_classes={hp.num_classes}. Fix data.num_classes."
            )
        train_idx, val_idx = split_off(
            train_labels, hp.val_fraction, hp.seed, folds=hp.folds, fold=hp.fold
        )

        # Statistics of the training part only: nothing from validation or test leaks in.
        self.mean = train_images[train_idx].mean(dim=(0, 2, 3), keepdim=True)
        self.std = train_images[train_idx].std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
        train, val = train_images[train_idx], train_images[val_idx]
        self.data_train = BatchIndexedTensors(self.standardise(train), train_labels[train_idx])
        self.data_val = BatchIndexedTensors(self.standardise(val), train_labels[val_idx])
        self.data_test = BatchIndexedTensors(self.standardise(test_images), test_labels)

    def standardise(self, images: torch.Tensor) -> torch.Tensor:
        return (images - self.mean) / self.std

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, list) and batch[0].dtype == torch.uint8:  # image files to predict
            self.mean, self.std = self.mean.to(batch[0].device), self.std.to(batch[0].device)
            return [self.standardise(batch[0].float() / 255), *batch[1:]]
        training = self.batch_augment and self.trainer is not None and self.trainer.training
        if not training or not isinstance(batch, list | tuple):  # or the summary's example input
            return batch
        images, labels = batch
        if self._fill is None or self._fill.device != images.device:
            self._fill = self.standardise(torch.zeros_like(self.mean)).to(images.device)
        trainer = self.trainer
        generator = self.generator(images.device, trainer.current_epoch, trainer.global_rank)
        return self.batch_augment(images, generator, self._fill), labels

    def state_dict(self) -> dict[str, Any]:
        # Lightning stores this in every checkpoint: prediction needs no training data; a run
        # resumed mid-epoch draws the augmentation of its next batch as if never stopped.
        state = {"mean": self.mean, "std": self.std}
        if self.generator is not None:
            state["augment"] = self.generator.state_dict()
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.mean, self.std = state_dict["mean"], state_dict["std"]
        if "augment" in state_dict and self.generator is not None:
            self.generator.load_state_dict(state_dict["augment"])

    def _loader(
        self, dataset: Dataset | None, shuffle: bool = False, drop_last: bool = False
    ) -> DataLoader:
        on_cuda = self.trainer is not None and isinstance(self.trainer.accelerator, CUDAAccelerator)
        if isinstance(dataset, BatchIndexedTensors) and (
            (self.hparams.on_device is True and self.trainer is not None)
            or (self.hparams.on_device == "auto" and on_cuda)
        ):
            from kindling.data.device_loader import serve_on_device  # only where it may serve

            loader = serve_on_device(self, dataset, shuffle)
            if loader is not None:
                return loader
        return super()._loader(dataset, shuffle, drop_last=drop_last)
