"""The `augment` config group (named torchvision.transforms.v2 transforms), applied two ways:
per image in the DataLoader workers (`worker_transform`), or, for in-memory data sets, which
have no workers, to whole batches on the device by `BatchAugment`, a draw per image (a v2
transform called on a batch draws once for all of it)."""

from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torchvision.transforms import v2

from kindling.errors import UserError

Transform = Callable[[torch.Tensor], torch.Tensor]


def worker_transform(augment: Mapping[str, Transform | None] | None) -> v2.Compose | None:
    """The augment entries in their config order (null entries are off), or None for none."""
    transforms = [t for t in (augment or {}).values() if t is not None]
    return v2.Compose(transforms) if transforms else None


def random_horizontal_flip(
    images: torch.Tensor, p: float, generator: torch.Generator
) -> torch.Tensor:
    """Mirror each image of `(B, C, H, W)` with probability `p`, drawn per image."""
    flip = torch.rand(len(images), device=images.device, generator=generator) < p
    return torch.where(flip[:, None, None, None], images.flip(-1), images)


def random_crop(
    images: torch.Tensor,
    size: tuple[int, int],
    padding: list[int] | None,
    fill: torch.Tensor | float,
    generator: torch.Generator,
) -> torch.Tensor:
    """A `size` window of each padded image of `(B, C, H, W)`, at an offset drawn per image;
    `padding`: `[left, right, top, bottom]` (as `v2.RandomCrop` stores it), filled with `fill`
    (a number, or `(1, C, 1, 1)` per channel)."""
    left, right, top, bottom = padding or (0, 0, 0, 0)
    # Pad with zeros around images shifted by -fill, then shift back: padding filled with `fill`.
    padded = F.pad(images - fill, (left, right, top, bottom)) + fill
    batch, _, height, width = padded.shape
    crop_h, crop_w = size
    if crop_h > height or crop_w > width:
        raise UserError(
            f"augment: a {crop_h}x{crop_w} crop does not fit {height}x{width} padded images. "
            "Set the crop's size to the data's image size."
        )
    device = images.device
    ys = torch.randint(0, height - crop_h + 1, (batch,), device=device, generator=generator)
    xs = torch.randint(0, width - crop_w + 1, (batch,), device=device, generator=generator)
    windows = padded.unfold(2, crop_h, 1).unfold(3, crop_w, 1)  # (B, C, y, x, h, w), a view
    return windows[torch.arange(batch, device=device), :, ys, xs]  # (B, C, h, w)


class BatchAugment:
    """The config's `v2.RandomCrop` and `v2.RandomHorizontalFlip`, applied to whole batches, a
    draw per image; other transforms need a per-image pipeline in workers, and are refused."""

    def __init__(self, augment: Mapping[str, Transform | None] | None):
        augment = {name: t for name, t in (augment or {}).items() if t is not None}
        self.transforms = list(augment.values())
        for name, transform in augment.items():
            if not isinstance(transform, v2.RandomHorizontalFlip | v2.RandomCrop):
                raise UserError(
                    f"augment.{name} ({type(transform).__name__}) runs on image folders only: "
                    "in-memory data sets augment whole batches on the device with RandomCrop "
                    "and RandomHorizontalFlip. Use data/augment=none, crop or flip_crop."
                )

    def __bool__(self) -> bool:
        return bool(self.transforms)

    def __call__(
        self, images: torch.Tensor, generator: torch.Generator, fill: torch.Tensor | float = 0.0
    ) -> torch.Tensor:
        """`fill`: what crop padding is filled with (for standardised images, a black pixel)."""
        for t in self.transforms:
            if isinstance(t, v2.RandomHorizontalFlip):
                images = random_horizontal_flip(images, t.p, generator)
            else:
                images = random_crop(images, t.size, t.padding, fill, generator)
        return images


class DeviceGenerator:
    """A random generator on the batches' device, seeded for each batch from the run's seed, the
    epoch, the batch's place in the epoch and the process rank: draws repeat across runs, differ
    between the processes of a multi-device run, and, with the place saved in checkpoints
    (`state_dict`), a run resumed mid-epoch draws for its next batch what it would have drawn."""

    def __init__(self, seed: int):
        self.seed = seed
        self.generator: torch.Generator | None = None
        self.epoch: int | None = None
        self.batch = 0  # batches drawn for in this epoch

    def __call__(self, device: torch.device, epoch: int, rank: int) -> torch.Generator:
        if self.generator is None or self.generator.device != device:
            self.generator = torch.Generator(device=device)
        if self.epoch != epoch:
            self.epoch, self.batch = epoch, 0
        # A tuple of ints hashes the same in every process; kept below 2**63.
        self.generator.manual_seed(hash((self.seed, epoch, self.batch, rank)) % 2**63)
        self.batch += 1
        return self.generator

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "batch": self.batch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.batch = state["epoch"], state["batch"]
