"""MNIST, Fashion-MNIST and CIFAR-10 through torchvision, in torchvision's own on-disk layout."""

from pathlib import Path
from typing import ClassVar

import torch
from torchvision import datasets

from kindling.data.in_memory import InMemoryImageDataModule, Split
from kindling.errors import UserError


class TorchvisionDataModule(InMemoryImageDataModule):
    """A torchvision data set under `data_dir`, downloaded in `prepare_data` when `download` is on.

    Subclasses name the torchvision class.
    """

    dataset_class: ClassVar[type[datasets.VisionDataset]]

    def __init__(self, *args, download: bool = True, **kwargs):
        super().__init__(*args, **kwargs)
        self.download = download

    def expected_files(self) -> tuple[Path, list[str]]:
        """The folder torchvision reads and the files it needs there."""
        cls, root = self.dataset_class, Path(self.hparams.data_dir).resolve()
        if issubclass(cls, datasets.MNIST):  # the uncompressed files; the .gz are downloaded
            return root / cls.__name__ / "raw", [n.removesuffix(".gz") for n, _ in cls.resources]
        names = [name for name, _md5 in cls.train_list + cls.test_list] + [cls.meta["filename"]]
        return root / cls.base_folder, names

    def _dataset(self, train: bool, download: bool = False) -> datasets.VisionDataset:
        try:
            return self.dataset_class(self.hparams.data_dir, train=train, download=download)
        except (RuntimeError, OSError) as error:  # torchvision's "not found", URLError, ...
            folder, files = self.expected_files()
            raise UserError(
                f"{self.dataset_class.__name__} files are missing from {folder} "
                f"({'download failed' if download else 'download is off'}: {error}).\n"
                f"Put these files there: {', '.join(files)}\n"
                "or run once with network access and data.download=true, "
                "or point data.data_dir at a folder that has them."
            ) from error

    def prepare_data(self) -> None:
        # Lightning calls this on one process per node, before setup(): the place to download.
        for train in (True, False):
            self._dataset(train, download=self.download)

    def load_splits(self) -> tuple[Split, Split]:
        return self._as_tensors(self._dataset(train=True)), self._as_tensors(self._dataset(False))

    @staticmethod
    def _as_tensors(dataset: datasets.VisionDataset) -> Split:
        images = torch.as_tensor(dataset.data)  # (N, H, W) grey or (N, H, W, C) colour
        images = images.unsqueeze(1) if images.ndim == 3 else images.permute(0, 3, 1, 2)
        labels = torch.as_tensor(dataset.targets, dtype=torch.long)
        return images.float().div_(255.0).contiguous(), labels


class MNISTDataModule(TorchvisionDataModule):
    """28x28 grey handwritten digits, 60,000 train and 10,000 test images."""

    dataset_class = datasets.MNIST


class FashionMNISTDataModule(MNISTDataModule):
    """28x28 grey images of clothing in 10 classes, in MNIST's format."""

    dataset_class = datasets.FashionMNIST


class CIFAR10DataModule(TorchvisionDataModule):
    """32x32 colour images in 10 classes, 50,000 train and 10,000 test images."""

    dataset_class = datasets.CIFAR10
