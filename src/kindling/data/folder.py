"""Where samples come from: image files in torchvision's ImageFolder layout.

<root>/<class>/<files>                       one pool: val and test are carved from it
<root>/train/<class>/<files>, [val/, test/]  given splits; an absent one is carved from train
"""

import logging
from dataclasses import dataclass, field
from pathlib import Path

from torch.utils.data import Dataset

from kindling.config.errors import UserError
from kindling.data.image_files import ImageFiles

log = logging.getLogger(__name__)

# What torchvision.io or PIL decode; anything else in a class folder is skipped and counted.
IMAGE_SUFFIXES = frozenset(
    {".png", ".jpg", ".jpeg", ".gif", ".webp", ".bmp", ".tif", ".tiff", ".ppm", ".pgm"}
)
SPLITS = ("train", "val", "test")

Samples = list[tuple[Path, int]]  # (file, class index)


@dataclass
class FolderSplits:
    """The classes (sorted folder names) and the samples of each split found on disk."""

    root: Path
    classes: list[str]
    splits: dict[str, Samples] = field(default_factory=dict)  # only the splits on disk
    skipped: int = 0  # files that are not images


def image_files(folder: Path) -> tuple[list[Path], int]:
    """Image files under `folder` (any depth, sorted) and the number of other files skipped."""
    files, skipped = [], 0
    for path in sorted(folder.rglob("*")):
        if not path.is_file() or path.name.startswith("."):
            continue
        if path.suffix.lower() in IMAGE_SUFFIXES:
            files.append(path)
        else:
            skipped += 1
    return files, skipped


def class_folders(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))


def split_root(root: Path) -> Path:
    """The folder whose subfolders are the training classes."""
    return root / "train" if (root / "train").is_dir() else root


def check_root(root: Path) -> None:
    if not root.exists():
        raise UserError(
            f"data.path={root} does not exist. Point data.path at a folder laid out as "
            "<path>/<class>/<images> or <path>/train/<class>/<images>."
        )
    if not root.is_dir():
        raise UserError(
            f"data.path={root} is a file; give the folder that holds the class folders."
        )


def class_names(root: str | Path | None) -> list[str]:
    """The class names of an image folder: the subfolders of `<root>/train`, or of `<root>`."""
    if root is None:
        raise UserError(
            "data=image_folder needs the folder of your images: data.path=<folder>, laid out as "
            "<folder>/<class>/<images> or <folder>/train/<class>/<images>."
        )
    root = Path(root)
    check_root(root)
    folders = class_folders(split_root(root))
    if not folders:
        raise UserError(
            f"{split_root(root)} has no class subfolders. Put each class's images in a "
            "folder of its own: <path>/<class>/<images> (e.g. <path>/cat/1.jpg, <path>/dog/2.jpg)."
        )
    return [f.name for f in folders]


def class_count(root: str | Path | None) -> int:
    """The number of classes in an image folder (the `${class_count:...}` config resolver)."""
    return len(class_names(root))


def read_image_folder(root: str | Path) -> FolderSplits:
    """Find the classes and the samples of every split on disk; refuse layouts that cannot train."""
    root = Path(root)
    classes = class_names(root)
    has_splits = (root / "train").is_dir()
    folder = FolderSplits(root, classes)
    for split in SPLITS if has_splits else ("train",):
        split_dir = root / split if has_splits else root
        if not split_dir.is_dir():
            continue
        found = [f.name for f in class_folders(split_dir)]
        unknown = sorted(set(found) - set(classes))
        if unknown:
            raise UserError(
                f"{split_dir} has class folders that {root / 'train'} does not: "
                f"{', '.join(unknown)}. Add them to train/ or remove them from {split}/."
            )
        samples: Samples = []
        for name in found:
            files, skipped = image_files(split_dir / name)
            folder.skipped += skipped
            if not files and split == "train":
                raise UserError(
                    f"Class folder {split_dir / name} has no image files "
                    f"({', '.join(sorted(IMAGE_SUFFIXES))}). Add images or remove the folder."
                )
            samples += [(f, classes.index(name)) for f in files]
        folder.splits[split] = samples
    if folder.skipped:
        log.info("Skipped %d files under %s that are not images (by suffix).", folder.skipped, root)
    return folder


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
    rows = list(zip(files, range(len(files)), strict=True))
    return ImageFiles(rows, channels, size, predicting=True), [str(f) for f in files]
