"""Your own images: a folder of image files in torchvision's ImageFolder layout, decoded in
DataLoader workers (or, `decode_device=cuda`, JPEGs in batches on the GPU by nvJPEG), batched as
uint8 and standardised on the device.

<root>/<class>/<files>                       one pool: val and test are carved from it
<root>/train/<class>/<files>, [val/, test/]  given splits; an absent one is carved from train
"""

import json
import logging
from collections.abc import Mapping, Sequence
from io import BytesIO
from pathlib import Path
from typing import Any, Literal

import torch
from PIL import Image
from torch.utils.data import DataLoader, Dataset, get_worker_info
from torchvision.datasets.folder import IMG_EXTENSIONS
from torchvision.io import ImageReadMode, decode_image, decode_jpeg, read_file
from torchvision.transforms.v2.functional import pil_to_tensor, resize

from kindling.data.augment import Transform, worker_transform
from kindling.data.loaders import SPLITS, SplitDataModule, split_off
from kindling.errors import UserError
from kindling.files import write_atomically

log = logging.getLogger(__name__)


# ImageFolder's and GIF: what torchvision.io or PIL decode. Other files are skipped and counted.
IMAGE_SUFFIXES = frozenset((*IMG_EXTENSIONS, ".gif"))
STATISTICS_FILE = ".kindling_statistics.json"  # beside the data, in data.path
JPEG_MAGIC = b"\xff\xd8\xff"

Samples = list[tuple[Path, int]]  # (file, class index)


def image_files(folder: Path) -> tuple[list[Path], int]:
    """Image files under `folder` (any depth, sorted) and the number of other files skipped."""
    paths = [p for p in sorted(folder.rglob("*")) if p.is_file() and not p.name.startswith(".")]
    files = [p for p in paths if p.suffix.lower() in IMAGE_SUFFIXES]
    return files, len(paths) - len(files)


def class_folders(folder: Path) -> list[str]:  # sorted, not hidden
    return sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def class_names(root: str | Path) -> list[str]:
    """The subfolders of `<root>/train`, or of `<root>`."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(
            f"data.path={root} {'is a file' if root.exists() else 'does not exist'}. Point "
            "data.path at a folder laid out as <path>/<class>/<images> or <path>/train/<class>/..."
        )
    folder = root / "train" if (root / "train").is_dir() else root
    classes = class_folders(folder)
    if not classes:
        raise UserError(
            f"{folder} has no class subfolders. Put each class's images in a folder of its own: "
            "<path>/<class>/<images> (e.g. <path>/cat/1.jpg, <path>/dog/2.jpg)."
        )
    return classes


def read_image_folder(root: str | Path) -> tuple[list[str], dict[str, Samples]]:
    """The classes (sorted folder names) and the samples of each split on disk; refuse layouts
    that cannot train."""
    root = Path(root)
    classes = class_names(root)
    has_splits = (root / "train").is_dir()
    splits, skipped = {}, 0
    for split in SPLITS if has_splits else ("train",):
        split_dir = root / split if has_splits else root
        if not split_dir.is_dir():
            continue
        found = class_folders(split_dir)
        unknown = sorted(set(found) - set(classes))
        if unknown:
            raise UserError(
                f"{split_dir} has class folders that {root / 'train'} does not: "
                f"{', '.join(unknown)}. Add them to train/ or remove them from {split}/."
            )
        splits[split] = []
        for name in found:
            files, not_images = image_files(split_dir / name)
            skipped += not_images
            if not files and split == "train":
                raise UserError(
                    f"Class folder {split_dir / name} has no image files "
                    f"({', '.join(sorted(IMAGE_SUFFIXES))}). Add images or remove the folder."
                )
            splits[split] += [(f, classes.index(name)) for f in files]
    if skipped:
        log.info("Skipped %d files under %s that are not images (by suffix).", skipped, root)
    return classes, splits


class UnreadableImage(Exception):
    """A file that neither torchvision.io nor PIL can decode (corrupt, truncated, not an image)."""


def read_image(source: Path | torch.Tensor, channels: int, size: int) -> torch.Tensor:
    """uint8 `(channels, size, size)` of an image file or its bytes, of any size and mode:
    torchvision.io (libjpeg-turbo, libpng), PIL for the formats torchvision does not decode
    (BMP, TIFF, PPM)."""
    is_path = isinstance(source, Path)
    try:
        mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
        image = decode_image(str(source) if is_path else source, mode=mode)
    except (RuntimeError, ValueError):  # not a format torchvision decodes, or a broken file
        try:  # PIL decides which
            with Image.open(source if is_path else BytesIO(source.numpy())) as file:
                image = pil_to_tensor(file.convert("L" if channels == 1 else "RGB"))
        except Exception as error:  # PIL raises many kinds: OSError, SyntaxError, ValueError
            raise UnreadableImage(f"{source if is_path else 'an image'}: {error}") from error
    return resize(image, [size, size], antialias=True)  # unchanged where it has that size


class ImageFiles(Dataset):
    """`(image, label)` of `(file, label)` samples, each image uint8 `(channels, size, size)`,
    then `transform`ed (training augmentation).

    A file that cannot be decoded is replaced by the next readable one (named in a warning, once
    per worker): a run never dies mid-epoch on a bad file, and every batch keeps its size.
    `predicting`: samples are files, each served as `(image, row, readable)`, `row` its index,
    a blank image where the file is unreadable.
    `encoded`: `(file bytes, label)`, for `decode_batch`.

    In a worker its state is the worker's torch generator, which `transform` draws from:
    torchdata's `StatefulDataLoader` saves it, so a run resumed mid-epoch augments the rest of
    the epoch as it would have. `rank` keeps one process's generators from another's workers.
    """

    def __init__(
        self,
        samples: Samples | list[Path],
        channels: int,
        size: int,
        transform: Transform | None = None,
        predicting: bool = False,
        encoded: bool = False,
        rank: int = 0,
    ):
        self.samples, self.channels, self.size = samples, channels, size
        self.transform, self.predicting, self.encoded = transform, predicting, encoded
        self.reported: set[Path] = set()
        self.rank = rank
        if encoded:  # files differ in length: a batch is the list of its `(bytes, label)`
            self.collate = list

    def state_dict(self) -> dict[str, Any]:
        if get_worker_info() is None:  # in the main process, the run's generators are saved
            return {}
        return {"rank": self.rank, "torch": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state and get_worker_info() is not None and state["rank"] == self.rank:
            torch.set_rng_state(state["torch"])

    def identify(self, digest: Any) -> None:  # kindling.data.fingerprint
        # Names, not paths: the same images in a folder moved elsewhere are the same data.
        for path, label in self.samples:
            path = Path(path)
            digest.update(
                f"{path.parent.name}/{path.name}\0{path.stat().st_size}\0{label}\n".encode()
            )

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int] | tuple[torch.Tensor, int, bool]:
        if self.encoded:
            path, label = self.samples[index]
            # A copy: read_file's tensor maps the file, which no worker can share.
            return read_file(str(path)).clone(), label
        if self.predicting:
            try:
                return read_image(self.samples[index], self.channels, self.size), index, True
            except UnreadableImage:
                blank = torch.zeros(self.channels, self.size, self.size, dtype=torch.uint8)
                return blank, index, False
        for offset in range(len(self.samples)):
            path, label = self.samples[(index + offset) % len(self.samples)]
            try:
                image = read_image(path, self.channels, self.size)
            except UnreadableImage as error:
                if path not in self.reported:
                    self.reported.add(path)
                    log.warning("Skipped unreadable image %s", error)
                continue
            if self.transform is not None:
                image = self.transform(image)
            return image, label
        raise RuntimeError(f"none of the {len(self.samples)} image files can be decoded")


def files_to_predict(folder: str | Path, channels: int, size: int) -> tuple[Dataset, list[str]]:
    """The image files under `folder` (`python -m kindling.predict input=<folder>`), as a data
    set of `(image, row, readable)`, and their names, in the folder's sorted order."""
    folder = Path(folder)
    if not folder.is_dir():
        raise UserError(f"input={folder} is not a folder. Give a folder of images, or test / val.")
    files, skipped = image_files(folder)
    if not files:
        raise UserError(f"No image files ({', '.join(sorted(IMAGE_SUFFIXES))}) in {folder}.")
    if skipped:
        log.info("Skipped %d files in %s that are not images (by suffix).", skipped, folder)
    return ImageFiles(files, channels, size, predicting=True), [str(f) for f in files]


def channel_statistics(dataset: Dataset, sample: int, seed: int = 0) -> tuple[list, list]:
    """Mean and std per channel, in [0, 1] units, of up to `sample` images of `dataset`."""
    generator = torch.Generator().manual_seed(seed)
    indices = torch.randperm(len(dataset), generator=generator)[:sample].tolist()
    images = (dataset[i][0].double().div_(255.0).flatten(1) for i in indices)  # (C, H*W) each
    mean, mean_square = torch.stack(
        [torch.stack([x.mean(1), x.square().mean(1)]) for x in images]
    ).mean(0)
    std = (mean_square - mean.square()).clamp_min(1e-12).sqrt()
    return mean.tolist(), std.clamp_min(1e-6).tolist()


def to_model_input(images: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """uint8 `(B, C, H, W)` -> float32, standardised per channel (`mean`, `std` in [0, 1] units,
    shaped `(1, C, 1, 1)` on the images' device)."""
    return images.float().sub_(mean * 255.0).div_(std * 255.0)


def decode_batch(
    encoded: Sequence[torch.Tensor],
    device: torch.device,
    channels: int,
    size: int,
    transform: Transform | None = None,
) -> torch.Tensor:
    """uint8 `(B, channels, size, size)` on `device`: JPEGs decoded there in one call, other
    formats decoded on the CPU (`read_image`) and copied."""
    mode = ImageReadMode.GRAY if channels == 1 else ImageReadMode.RGB
    is_jpeg = [bytes(data[:3].tolist()) == JPEG_MAGIC for data in encoded]
    jpegs = [data for data, j in zip(encoded, is_jpeg, strict=True) if j]
    decoded = iter(decode_jpeg(jpegs, mode=mode, device=device) if jpegs else [])
    images = []
    for data, jpeg in zip(encoded, is_jpeg, strict=True):
        if jpeg:
            image = resize(next(decoded), [size, size], antialias=True)
        else:  # read_image resizes
            image = read_image(data, channels, size).to(device)
        images.append(transform(image) if transform is not None else image)
    return torch.stack(images)


class LabelledDataModule(SplitDataModule):
    """A data module whose class names and training statistics (`mean`, `std`; of images
    `(1, C, 1, 1)` in [0, 1] units) checkpoints hold, so that testing and prediction need no
    training data. uint8 image batches are standardised with them on the device."""

    classes: list[str] | None = None
    mean: torch.Tensor | None = None
    std: torch.Tensor | None = None

    def check_classes(self, found: list[str] | None, trained: list[str] | None) -> None:
        """Refuse data (`found`) whose classes are not a loaded checkpoint's (`trained`)."""
        if None not in (found, trained) and found != trained:
            source = self.hparams.get("path") or f"data.input_dir={self.hparams.input_dir}"
            raise UserError(
                f"{source} has the classes {', '.join(found)}, but the checkpoint was trained on "
                f"{', '.join(trained)}. Use data with the checkpoint's classes."
            )

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # The model summary's example input, and sequences (standardised in the workers), pass.
        if not isinstance(batch, list | tuple) or batch[0].dtype != torch.uint8:
            return batch
        images, *rest = batch  # labels, or a prediction's rows and readable
        mean, std = self.mean.to(images.device), self.std.to(images.device)
        return [to_model_input(images, mean, std), *rest]

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.mean, "std": self.std, "classes": self.classes}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.check_classes(self.classes, state_dict["classes"])  # the data's, if set up first
        self.mean, self.std = state_dict["mean"], state_dict["std"]
        self.classes = state_dict["classes"]


class ImageFolderDataModule(LabelledDataModule):
    """Image files in torchvision's ImageFolder layout, for classification, the classes the
    sorted folder names; an absent split is carved from train with `seed`. Its arguments are
    configs/data/image_folder.yaml's keys, each explained there."""

    def __init__(
        self,
        path: str | None,
        num_classes: int | None = None,
        image_size: int = 64,
        channels: Literal[1, 3] = 3,
        image_shape: Sequence[int] | None = None,
        batch_size: int = 64,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        seed: int = 0,
        augment: Mapping[str, Transform | None] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        statistics_sample: int = 1000,
        unreadable: Literal["skip", "check"] = "skip",
        num_workers: int | None = None,
        pin_memory: bool = True,
        persistent_workers: bool = True,
        prefetch_factor: int = 2,
        drop_last: bool = True,
        decode_device: Literal["cpu", "cuda"] = "cpu",
        folds: int | None = None,
        fold: int | None = None,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["augment"])
        if path is None:
            raise UserError(
                "data=image_folder needs the folder of your images: data.path=<folder>, laid out "
                "as <folder>/<class>/<images> or <folder>/train/<class>/<images>."
            )
        expected = [channels, image_size, image_size]
        if image_shape is not None and list(image_shape) != expected:
            raise UserError(
                f"data.image_shape={list(image_shape)} disagrees with data.channels={channels} "
                f"and data.image_size={image_size}: set those two; image_shape follows them."
            )
        if (mean is None) != (std is None):
            raise UserError("Give data.mean and data.std together, or neither (measured).")
        if decode_device == "cuda" and not torch.cuda.is_available():
            raise UserError(
                "data.decode_device=cuda decodes images on a CUDA GPU, but CUDA is not available "
                "(torch.cuda.is_available() is False). Use data.decode_device=cpu."
            )
        self.transform = worker_transform(augment)

    def describe(self) -> dict[str, Any]:
        if self.hparams.num_classes is not None:
            return {}
        return {"num_classes": len(class_names(self.hparams.path))}

    def inputs_to_predict(self, path: str) -> tuple[Dataset, list[str]]:
        return files_to_predict(path, self.hparams.channels, self.hparams.image_size)

    def setup_splits(self) -> None:
        hp = self.hparams
        classes, on_disk = read_image_folder(hp.path)
        if hp.num_classes is not None and len(classes) != hp.num_classes:
            raise UserError(
                f"data.num_classes={hp.num_classes} but {hp.path} has {len(classes)} "
                f"class folders ({', '.join(classes)}). Set data.num_classes="
                f"{len(classes)}, or leave it out: it is counted from the folders."
            )
        self.check_classes(classes, self.classes)
        self.classes = classes
        splits = self._splits(on_disk)
        # GPU decoding cannot skip a bad file inside a batch: it always checks first.
        encoded = hp.decode_device == "cuda"
        if hp.unreadable == "check" or encoded:
            self._check_readable([f for samples in splits.values() for f, _ in samples])

        size, channels = hp.image_size, hp.channels
        rank = self.trainer.global_rank if self.trainer is not None else 0
        self.data_train = ImageFiles(
            splits["train"], channels, size, self.transform, encoded=encoded, rank=rank
        )
        self.data_val = ImageFiles(splits["val"], channels, size, encoded=encoded)
        self.data_test = ImageFiles(splits["test"], channels, size, encoded=encoded)
        if self.mean is None:
            self._set_statistics(ImageFiles(splits["train"], channels, size))
        counts = ", ".join(f"{name} {len(samples)}" for name, samples in splits.items())
        log.info("%s: %d classes; images: %s.", hp.path, len(self.classes), counts)

    def _splits(self, on_disk: dict[str, Samples]) -> dict[str, Samples]:
        hp = self.hparams
        train, test, val = on_disk["train"], on_disk.get("test"), on_disk.get("val")
        if val is not None and hp.folds is not None:
            raise UserError(
                f"data.folds={hp.folds}: {Path(hp.path) / 'val'} is a validation split of its own. "
                "Leave out data.folds and data.fold, or move val/ into train/ to cross-validate."
            )
        if test is None:
            train, test = _split(train, hp.test_fraction, hp.seed)
        if val is None:
            train, val = _split(train, hp.val_fraction, hp.seed + 1, hp.folds, hp.fold)
        for name, samples in (("val", val), ("test", test)):
            if not samples:
                raise UserError(
                    f"{Path(hp.path) / name} has no image files. Add images, or remove the "
                    f"folder to carve {name} from train."
                )
        return {"train": train, "val": val, "test": test}

    def _check_readable(self, files: list[Path]) -> None:
        # The workers decode in parallel; one pass over every file, before any training.
        rows = ImageFiles(files, self.hparams.channels, self.hparams.image_size, predicting=True)
        loader = DataLoader(rows, batch_size=64, num_workers=self.num_workers)
        bad = [files[row] for _, batch, readable in loader for row in batch[~readable].tolist()]
        if bad:
            shown = "\n  ".join(str(p) for p in bad[:20])
            more = f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else ""
            raise UserError(
                f"{len(bad)} image files cannot be decoded:\n  {shown}{more}\n"
                "Remove or replace them, or set data.unreadable=skip to train without them."
            )

    def _set_statistics(self, train: ImageFiles) -> None:
        hp = self.hparams
        mean, std = hp.mean, hp.std
        if mean is None:  # measured once, cached beside the data where it can be written
            cache = Path(hp.path) / STATISTICS_FILE
            key = (
                f"{hp.channels}x{hp.image_size}, {len(train)} images, sample {hp.statistics_sample}"
            )
            try:
                stored = json.loads(cache.read_text())
            except (OSError, ValueError):  # none yet, or unreadable
                stored = {}
            if key not in stored:
                mean, std = channel_statistics(train, hp.statistics_sample, hp.seed)
                stored[key] = {"mean": mean, "std": std}
                text = json.dumps(stored, indent=1).encode()
                try:  # atomically: the processes of a multi-device run may write it at once
                    write_atomically(cache, lambda file: file.write(text))
                except OSError as error:
                    log.info("Could not cache image statistics in %s (%s).", cache, error)
            mean, std = stored[key]["mean"], stored[key]["std"]
        if len(mean) != hp.channels or len(std) != hp.channels:
            raise UserError(
                f"data.mean and data.std need {hp.channels} values (one per channel); "
                f"got {len(mean)} and {len(std)}."
            )
        self.mean = torch.tensor(mean).view(1, -1, 1, 1)
        self.std = torch.tensor(std).view(1, -1, 1, 1)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self.hparams.decode_device != "cuda" or self.data_predict is not None:
            return batch
        encoded, labels = zip(*batch, strict=True)
        transform = self.transform if self.trainer.training else None
        device, hp = self.trainer.strategy.root_device, self.hparams
        images = decode_batch(encoded, device, hp.channels, hp.image_size, transform)
        return images, torch.tensor(labels)


def _split(
    samples: Samples, fraction: float, seed: int, folds: int | None = None, fold: int | None = None
) -> tuple[Samples, Samples]:
    labels = torch.tensor([label for _, label in samples])
    rest, held = split_off(labels, fraction, seed, folds=folds, fold=fold)
    return [samples[i] for i in rest.tolist()], [samples[i] for i in held.tolist()]
