"""What a data module's splits hold, in a few bytes: a checkpoint keeps it, and a resume on data
that changed under it (rows removed or added, a label changed, an image replaced) is refused
instead of training on splits carved afresh, its test split among them (docs/resume.md)."""

import hashlib
from typing import Any, Protocol, runtime_checkable

import torch
from torch.utils.data import Dataset, TensorDataset

from kindling.data.loaders import SplitDataModule

SPLITS = ("train", "val", "test")


@runtime_checkable
class Identifiable(Protocol):
    def identify(self, digest: Any) -> None:
        """Feed `digest` what identifies the samples, as cheap to read as it is for this kind
        of split (an image folder: each file's name, size and label)."""


def fingerprint(datamodule: object) -> dict[str, dict[str, Any]] | None:
    """`{split: {"samples": n, "hash": h}}` of a set-up `SplitDataModule`'s splits; None for
    another data module (nothing is compared)."""
    if not isinstance(datamodule, SplitDataModule) or datamodule.data_train is None:
        return None
    splits = {name: getattr(datamodule, f"data_{name}") for name in SPLITS}
    prints = {name: split_fingerprint(split) for name, split in splits.items() if split}
    return {name: value for name, value in prints.items() if value is not None} or None


def split_fingerprint(dataset: Dataset) -> dict[str, Any] | None:
    """`{"samples": n, "hash": h}`; `h` over what an `Identifiable` split feeds it, or over an
    in-memory set's tensors. None for a kind of split it does not know."""
    digest = hashlib.blake2b(digest_size=16)
    if isinstance(dataset, Identifiable):
        dataset.identify(digest)
    elif isinstance(dataset, TensorDataset):
        for tensor in dataset.tensors:
            digest.update(tensor_bytes(tensor))
    else:
        return None
    return {"samples": len(dataset), "hash": digest.hexdigest()}


def tensor_bytes(tensor: torch.Tensor) -> bytes:
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().tobytes()


def changes(stored: dict[str, dict], current: dict[str, dict]) -> list[str]:
    """What differs between two fingerprints, split by split, in words."""
    said = []
    for split in SPLITS:
        before, now = stored.get(split), current.get(split)
        if before is None or now is None or before == now:
            continue
        if before["samples"] != now["samples"]:
            said.append(f"its {split} split has {now['samples']} samples, not {before['samples']}")
        else:
            said.append(f"its {split} split holds other samples (as many, {now['samples']})")
    return said
