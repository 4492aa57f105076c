"""LightningDataModules: one file per family of data sets."""

from kindling.lazy_exports import lazy_exports

MODULES = {
    "digits": ["DigitsDataModule"],
    "image": ["InMemoryImageDataModule"],
    "image_folder": ["ImageFolderDataModule"],
    "text": ["CharTextDataModule"],
    "torchvision_datasets": ["CIFAR10DataModule", "FashionMNISTDataModule", "MNISTDataModule"],
}
__all__ = sorted(name for names in MODULES.values() for name in names)
__getattr__ = lazy_exports(__name__, MODULES)
