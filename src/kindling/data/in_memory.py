"""Images held in memory as tensors (digits, the torchvision sets), a batch by one index."""

from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from torch.utils.data import DataLoader, Dataset, TensorDataset

from kindling.config.errors import UserError
from kindling.data.loaders import PREDICT_SPLITS, SplitDataModule, per_device_batch_size
from kindling.data.splits import check_folds, split_off

if TYPE_CHECKING:
    from kindling.data.device_loader import DeviceTensorLoader

# data.on_device=auto: the share of the device's free memory the whole data set may take.
ON_DEVICE_SHARE = 0.25

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

    Subclasses implement `load_splits`, returning the train and test splits; this class holds
    out validation (a seeded `val_fraction`, or fold `fold` of `folds`: kindling.data.splits)
    and serves all three. Its arguments are configs/data/_base/in_memory_image.yaml's keys;
    `seed` seeds the validation split alone, so it stays the same across a seed sweep.
    `on_device`: serve batches from the training device (`DeviceTensorLoader`) after one copy
    of the whole set; `auto` does on CUDA when the splits take at most `ON_DEVICE_SHARE` of its
    free memory. `augment`: random crops and flips of each training batch on the device, one
    draw per image (kindling.data.augment). A `predict_input` folder of image files is decoded
    to `image_shape` and standardised alike.
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
        self.save_hyperparameters(ignore=["augment"], logger=False)
        self.batch_augment = self.generator = None
        if any(t is not None for t in (augment or {}).values()):
            from kindling.data.augment import BatchAugment, DeviceGenerator  # only when augmenting

            self.batch_augment = BatchAugment(augment)
            self.generator = DeviceGenerator(torch.initial_seed())
        self._fill: torch.Tensor | None = None
        per_device_batch_size(batch_size, 1)  # fail at construction on a non-positive size
        if not 0.0 < val_fraction < 1.0:
            raise UserError(f"data.val_fraction must be between 0 and 1, got {val_fraction}.")
        check_folds(folds, fold)
        if on_device not in (True, False, "auto"):
            raise UserError(f"data.on_device must be true, false or auto, got {on_device!r}.")
        self._on_device: bool | None = None  # `on_device` decided, once the trainer is known
        self.mean: torch.Tensor | None = None  # of the training split, saved in checkpoints
        self.std: torch.Tensor | None = None

    @abstractmethod
    def load_splits(self) -> tuple[Split, Split]:
        """Return `(train, test)`, each `(images, labels)` with images float in [0, 1]."""

    def setup(self, stage: str | None = None) -> None:
        if stage == "predict" and self.predict_input not in PREDICT_SPLITS:  # image files
            from kindling.data.image_folder import files_to_predict

            channels, size = self.hparams.image_shape[:2]
            self.data_predict, self.names_to_predict = files_to_predict(
                self.predict_input, channels, size
            )
            return
        if self.data_train is not None:
            return
        self.batch_size_per_device  # noqa: B018 - validate before loading anything
        (train_images, train_labels), (test_images, test_labels) = self.load_splits()
        self._check(train_images, train_labels)

        hp = self.hparams
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
        """Images in [0, 1] -> what the model was trained on."""
        return (images - self.mean) / self.std

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if isinstance(batch, list) and batch[0].dtype == torch.uint8:  # image files to predict
            self.mean, self.std = self.mean.to(batch[0].device), self.std.to(batch[0].device)
            return [self.standardise(batch[0].float() / 255), *batch[1:]]
        if not (self.batch_augment and self.trainer is not None and self.trainer.training):
            return batch
        if not isinstance(batch, list | tuple):  # the model summary's example input
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

    def _check(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        expected = tuple(self.hparams.image_shape)
        if tuple(images.shape[1:]) != expected:
            raise UserError(
                f"{type(self).__name__}: images have shape {tuple(images.shape[1:])} but the data "
                f"config says image_shape={list(expected)}. Fix data.image_shape."
            )
        if int(labels.max()) >= self.hparams.num_classes:
            raise UserError(
                f"{type(self).__name__}: found label {int(labels.max())} but the data config says "
                f"num_classes={self.hparams.num_classes}. Fix data.num_classes."
            )

    def serves_on_device(self) -> bool:
        """Whether batches come from `DeviceTensorLoader` (`on_device`, with `auto` decided)."""
        if self.trainer is None:
            return False
        if self._on_device is None:
            choice = self.hparams.on_device
            if choice == "auto" and isinstance(self.trainer.accelerator, CUDAAccelerator):
                from kindling.data.device_loader import fits_on_device

                choice = fits_on_device(self, ON_DEVICE_SHARE)
            self._on_device = choice is True
        return self._on_device

    def _loader(
        self, dataset: Dataset | None, shuffle: bool = False, drop_last: bool = False
    ) -> "DataLoader | DeviceTensorLoader":
        if not isinstance(dataset, BatchIndexedTensors) or not self.serves_on_device():
            return super()._loader(dataset, shuffle, drop_last=drop_last)
        from kindling.data.device_loader import serve_on_device  # imported where it is used

        return serve_on_device(self, dataset, shuffle)
