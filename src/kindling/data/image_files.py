"""Decode image files to uint8 tensors of one size and channel count, in DataLoader workers."""

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from PIL import Image
from torch.utils.data import Dataset, get_worker_info
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2.functional import pil_to_tensor, resize

log = logging.getLogger(__name__)


class UnreadableImage(Exception):
    """A file that neither torchvision.io nor PIL can decode (corrupt, truncated, not an image)."""

    def __init__(self, path: Path, reason: object):
        super().__init__(f"{path}: {reason}")
        self.path = path


def decode_file(path: Path, channels: int) -> torch.Tensor:
    """uint8 `(channels, H, W)` at the file's own size: torchvision.io (libjpeg-turbo, libpng),
    PIL for the formats torchvision does not decode (BMP, TIFF, PPM, ...)."""
    mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
    try:
        return decode_image(str(path), mode=mode)
    except (RuntimeError, ValueError):
        pass  # not a format torchvision decodes, or a broken file: PIL decides which
    try:
        with Image.open(path) as image:
            return pil_to_tensor(image.convert("L" if channels == 1 else "RGB"))
    except Exception as error:  # PIL raises many kinds: OSError, SyntaxError, ValueError, ...
        raise UnreadableImage(path, error) from error


def read_image(path: Path, channels: int, size: int) -> torch.Tensor:
    """uint8 `(channels, size, size)`: any size and mode in, one size and channel count out."""
    image = decode_file(path, channels)
    if image.shape[-2:] != (size, size):
        image = resize(image, [size, size], antialias=True)
    return image


class ImageFiles(Dataset):
    """`(image, label)` pairs of image files, each image uint8 `(channels, size, size)`.

    Args:
        samples: `(file, label)` pairs.
        channels: 1 (grey) or 3 (RGB); files of other modes are converted.
        size: height and width; files of other sizes are resized.
        transform: applied to each uint8 image after resizing (training augmentation).
        skip_unreadable: serve the next readable file in place of one that cannot be decoded
            (named in a warning, once per worker) so a run never dies mid-epoch on a bad file
            and every batch keeps its size; otherwise raise `UnreadableImage`.
        predicting: serve `(image, label, readable)`, a blank image where a file cannot be
            decoded (the labels are then rows of `predict_names`: kindling.data.loaders).

    In a DataLoader worker its state is the worker's torch generator, which `transform` draws
    from: torchdata's `StatefulDataLoader` saves it with the loader's position, so a run resumed
    mid-epoch augments the rest of the epoch as it would have. `rank` (set by the data module)
    keeps one process's generators from being given to another's workers.
    """

    def __init__(
        self,
        samples: list[tuple[Path, int]],
        channels: int,
        size: int,
        transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
        skip_unreadable: bool = True,
        predicting: bool = False,
    ):
        self.samples = samples
        self.channels, self.size = channels, size
        self.transform = transform
        self.skip_unreadable = skip_unreadable
        self.predicting = predicting
        self.reported: set[Path] = set()
        self.rank = 0

    def state_dict(self) -> dict[str, Any]:
        if get_worker_info() is None:  # in the main process, the run's generators are saved
            return {}
        return {"rank": self.rank, "torch": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state and get_worker_info() is not None and state["rank"] == self.rank:
            torch.set_rng_state(state["torch"])

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int] | tuple[torch.Tensor, int, bool]:
        if self.predicting:
            path, row = self.samples[index]
            try:
                return read_image(path, self.channels, self.size), row, True
            except UnreadableImage:
                blank = torch.zeros(self.channels, self.size, self.size, dtype=torch.uint8)
                return blank, row, False
        for offset in range(len(self.samples)):
            path, label = self.samples[(index + offset) % len(self.samples)]
            try:
                image = read_image(path, self.channels, self.size)
            except UnreadableImage as error:
                if not self.skip_unreadable:
                    raise
                if path not in self.reported:
                    self.reported.add(path)
                    log.warning("Skipped unreadable image %s", error)
                continue
            if self.transform is not None:
                image = self.transform(image)
            return image, label
        raise RuntimeError(f"none of the {len(self.samples)} image files can be decoded")


def readable(path: Path, channels: int) -> bool:
    try:
        decode_file(path, channels)
    except UnreadableImage:
        return False
    return True
