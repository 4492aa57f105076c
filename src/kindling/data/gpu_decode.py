"""Decoding on the GPU (`data.decode_device=cuda`): workers only read file bytes; nvJPEG decodes
whole batches of JPEGs on the training GPU, which frees CPU cores when they are the bottleneck."""

from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import Dataset, default_collate
from torchvision.io import ImageReadMode, decode_image, decode_jpeg, read_file
from torchvision.transforms.v2.functional import resize

from kindling.config.errors import UserError

JPEG_MAGIC = b"\xff\xd8\xff"


def check_decode_device(decode_device: str) -> None:
    if decode_device == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "data.decode_device=cuda decodes images on a CUDA GPU, but CUDA is not available "
            "(torch.cuda.is_available() is False). Use data.decode_device=cpu."
        )


class EncodedImageFiles(Dataset):
    """`(file bytes, label)` pairs of `(file, label)` samples: the encoded files, decoded later,
    on the GPU, by `decode_batch` (which resizes, converts and augments them there)."""

    def __init__(self, samples: list[tuple[Path, int]]):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        path, label = self.samples[index]
        return read_file(str(path)), label

    @staticmethod
    def collate(batch: list[tuple[torch.Tensor, int]]) -> tuple[list[torch.Tensor], torch.Tensor]:
        """Files differ in length: a list of byte tensors, and the labels batched."""
        return [data for data, _ in batch], default_collate([label for _, label in batch])


def decode_batch(
    encoded: list[torch.Tensor],
    device: torch.device,
    channels: int,
    size: int,
    transform: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> torch.Tensor:
    """uint8 `(B, channels, size, size)` on `device`: JPEGs decoded there in one call, other
    formats decoded on the CPU (torchvision.io) and copied."""
    mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
    is_jpeg = [bytes(data[:3].tolist()) == JPEG_MAGIC for data in encoded]
    jpegs = [data for data, j in zip(encoded, is_jpeg, strict=True) if j]
    decoded = iter(decode_jpeg(jpegs, mode=mode, device=device) if jpegs else [])
    images = []
    for data, jpeg in zip(encoded, is_jpeg, strict=True):
        image = next(decoded) if jpeg else decode_image(data, mode=mode).to(device)
        image = resize(image, [size, size], antialias=True)
        images.append(transform(image) if transform is not None else image)
    return torch.stack(images)
