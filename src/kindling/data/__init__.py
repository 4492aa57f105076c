"""LightningDataModules: one file per family of data sets."""

from kindling.data.digits import DigitsDataModule
from kindling.data.image import ImageDataModule
from kindling.data.image_folder import ImageFolderDataModule
from kindling.data.text import CharTextDataModule
from kindling.data.torchvision_datasets import (
    CIFAR10DataModule,
    FashionMNISTDataModule,
    MNISTDataModule,
)

__all__ = [
    "CIFAR10DataModule",
    "CharTextDataModule",
    "DigitsDataModule",
    "FashionMNISTDataModule",
    "ImageDataModule",
    "ImageFolderDataModule",
    "MNISTDataModule",
]
