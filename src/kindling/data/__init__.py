"""LightningDataModules: one file per family of data sets."""

from kindling.lazy_exports import lazy_exports

MODULES = {
    "digits": ["DigitsDataModule"],
    "image": ["InMemoryImageDataModule"],
    "image_folder": ["ImageFolderDataModule"],
    "sequences": ["SequenceTableDataModule"],
    "text": ["CharTextDataModule"],
    "torchvision_datasets": ["CIFAR10DataModule", "FashionMNISTDataModule", "MNISTDataModule"],
}
__getattr__, __all__ = lazy_exports(__name__, MODULES)
