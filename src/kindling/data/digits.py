"""scikit-learn's 8x8 handwritten digits: real data that ships inside the package, no network."""

import torch
from sklearn.datasets import load_digits

from kindling.data.in_memory import InMemoryImageDataModule, Split
from kindling.data.loaders import split_off


class DigitsDataModule(InMemoryImageDataModule):
    """1,797 grey 8x8 images of the digits 0-9 (UCI optdigits test set, bundled with scikit-learn).

    There is no official test split: a seeded `test_fraction` of the images is held out.
    `data_dir` is unused (the data is inside scikit-learn); it is accepted so every data
    config has the same keys.
    """

    def __init__(self, *args, test_fraction: float = 0.2, **kwargs):
        super().__init__(*args, **kwargs)
        self.test_fraction = test_fraction

    def load_splits(self) -> tuple[Split, Split]:
        digits = load_digits()
        images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
        labels = torch.tensor(digits.target, dtype=torch.long)
        # A fixed seed for the test split, so test numbers compare across runs and seeds.
        train, test = split_off(labels, self.test_fraction, seed=1234)
        return (images[train], labels[train]), (images[test], labels[test])
