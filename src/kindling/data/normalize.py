"""Per-channel statistics of a training split, and uint8 batches made model input on the device."""

import json
import logging
from collections.abc import Callable
from pathlib import Path

import torch
from torch.utils.data import Dataset

from kindling.files import write_atomically

log = logging.getLogger(__name__)


def channel_statistics(
    dataset: Dataset, sample: int, seed: int = 0
) -> tuple[list[float], list[float]]:
    """Mean and standard deviation per channel, in [0, 1] units, of up to `sample` images of
    `dataset` (uint8 `(C, H, W)` images, chosen with `seed`)."""
    generator = torch.Generator().manual_seed(seed)
    indices = torch.randperm(len(dataset), generator=generator)[:sample].tolist()
    total = total_sq = None
    count = 0
    for index in indices:
        image = dataset[index][0].double().div_(255.0).flatten(1)  # (C, H*W)
        total = image.sum(1) if total is None else total + image.sum(1)
        total_sq = image.square().sum(1) if total_sq is None else total_sq + image.square().sum(1)
        count += image.shape[1]
    mean = total / count
    std = (total_sq / count - mean.square()).clamp_min(1e-12).sqrt()
    return mean.tolist(), std.clamp_min(1e-6).tolist()


Statistics = tuple[list[float], list[float]]  # mean, std per channel


def cached_statistics(cache: Path, key: str, compute: Callable[[], Statistics]) -> Statistics:
    """The statistics stored under `key` in the JSON file `cache`, or `compute()` stored there.

    A folder that cannot be written to only loses the cache: the statistics are computed again.
    """
    stored = {}
    if cache.is_file():
        try:
            stored = json.loads(cache.read_text())
        except (OSError, ValueError):
            stored = {}
    if key in stored:
        return stored[key]["mean"], stored[key]["std"]
    mean, std = compute()
    stored[key] = {"mean": mean, "std": std}
    # Processes of a multi-device run may write it at the same time.
    text = json.dumps(stored, indent=1).encode()
    try:
        write_atomically(cache, lambda file: file.write(text))
    except OSError as error:
        log.info("Could not cache image statistics in %s (%s).", cache, error)
    return mean, std


def to_model_input(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 `(B, C, H, W)` -> float32, standardised per channel (`mean`, `std` in [0, 1] units,
    shaped `(1, C, 1, 1)` on the images' device): one fused pass where the batch already is."""
    return images.float().sub_(mean * 255.0).div_(std * 255.0)
