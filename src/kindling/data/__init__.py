"""LightningDataModules: one file per family of data sets."""

from kindling.data.digits import DigitsDataModule
from kindling.data.image import ImageDataModule
from kindling.data.torchvision_datasets import (
    CIFAR10DataModule,
    FashionMNISTDataModule,
    MNISTDataModule,
)

__all__ = [
    "CIFAR10DataModule",
    "DigitsDataModule",
    "FashionMNISTDataModule",
    "ImageDataModule",
    "MNISTDataModule",
]
