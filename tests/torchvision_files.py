"""Tiny data sets written in torchvision's exact on-disk formats, for offline tests.

MNIST and Fashion-MNIST: IDX files (`<root>/<folder>/raw/*-ubyte`, or gzipped `*.gz` for the
download path), as read by `torchvision.datasets.mnist.read_sn3_pascalvincent_tensor`.

CIFAR-10: `<root>/cifar-10-batches-py/` with pickled batches as read by
`torchvision.datasets.CIFAR10` (protocol 2 pickles with `str` keys, like the real files that were
written by Python 2 and are loaded with `encoding="latin1"`), or the same folder inside a
`cifar-10-python.tar.gz` archive.

Pixels and labels are random (seeded), so a test can check that what a data module reads back
is exactly what was written.
"""

import gzip
import hashlib
import io
import pickle
import struct
import tarfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
CIFAR10_FOLDER = "cifar-10-batches-py"
CIFAR10_TRAIN_FILES = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR10_TEST_FILE = "test_batch"
CIFAR10_META_FILE = "batches.meta"
CIFAR10_ARCHIVE = "cifar-10-python.tar.gz"
CIFAR10_CLASSES = (
    "airplane",
    "automobile",
    "bird",
    "cat",
    "deer",
    "dog",
    "frog",
    "horse",
    "ship",
    "truck",
)


@dataclass(frozen=True)
class TinyDataset:
    """What was written: images `(N, C, H, W)` uint8, labels `(N,)` int64, and file md5s."""

    train_images: np.ndarray
    train_labels: np.ndarray
    test_images: np.ndarray
    test_labels: np.ndarray
    md5s: dict[str, str]  # file name (as torchvision lists it) -> md5 of the bytes written


def md5(data: bytes) -> str:
    return hashlib.md5(data).hexdigest()


def _random_split(
    rng: np.random.Generator, num: int, shape: tuple[int, ...], num_classes: int = 10
) -> tuple[np.ndarray, np.ndarray]:
    images = rng.integers(0, 256, size=(num, *shape), dtype=np.uint8)
    labels = rng.integers(0, num_classes, size=num).astype(np.int64)
    return images, labels


def idx_bytes(array: np.ndarray) -> bytes:
    """An uint8 array in IDX format: magic 0x0000080N (N dims), big-endian int32 dims, data."""
    assert array.dtype == np.uint8 and 1 <= array.ndim <= 3
    magic = (0x08 << 8) | array.ndim  # 2049 for labels (1 dim), 2051 for images (3 dims)
    header = struct.pack(f">{1 + array.ndim}i", magic, *array.shape)
    return header + np.ascontiguousarray(array).tobytes()


def _mnist_files(
    num_train: int, num_test: int, image_size: int, seed: int
) -> tuple[dict[str, bytes], TinyDataset]:
    rng = np.random.default_rng(seed)
    train_images, train_labels = _random_split(rng, num_train, (1, image_size, image_size))
    test_images, test_labels = _random_split(rng, num_test, (1, image_size, image_size))
    contents = dict(
        zip(
            MNIST_FILES,
            (
                idx_bytes(train_images[:, 0]),
                idx_bytes(train_labels.astype(np.uint8)),
                idx_bytes(test_images[:, 0]),
                idx_bytes(test_labels.astype(np.uint8)),
            ),
            strict=True,
        )
    )
    tiny = TinyDataset(train_images, train_labels, test_images, test_labels, md5s={})
    return contents, tiny


def write_mnist(
    root: Path,
    folder_name: str = "MNIST",
    num_train: int = 20,
    num_test: int = 10,
    image_size: int = 28,
    seed: int = 0,
) -> TinyDataset:
    """Uncompressed IDX files in `<root>/<folder_name>/raw/`, where torchvision reads them.

    Use `folder_name="FashionMNIST"` for Fashion-MNIST (same format, its class name as folder).
    """
    contents, tiny = _mnist_files(num_train, num_test, image_size, seed)
    raw = Path(root) / folder_name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    for name, data in contents.items():
        (raw / name).write_bytes(data)
        tiny.md5s[name] = md5(data)
    return tiny


def write_mnist_gz(
    folder: Path, num_train: int = 20, num_test: int = 10, image_size: int = 28, seed: int = 0
) -> TinyDataset:
    """Gzipped IDX files (`train-images-idx3-ubyte.gz`, ...) in `folder`, as a mirror serves them.

    `md5s` maps each `.gz` name to its md5, the pairs `MNIST.resources` lists.
    """
    contents, tiny = _mnist_files(num_train, num_test, image_size, seed)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in contents.items():
        compressed = gzip.compress(data, mtime=0)
        (folder / f"{name}.gz").write_bytes(compressed)
        tiny.md5s[f"{name}.gz"] = md5(compressed)
    return tiny


def _cifar10_files(
    num_train_per_batch: int, num_test: int, seed: int
) -> tuple[dict[str, bytes], TinyDataset]:
    rng = np.random.default_rng(seed)
    shape = (3, 32, 32)
    batches = [_random_split(rng, num_train_per_batch, shape) for _ in CIFAR10_TRAIN_FILES]
    test_images, test_labels = _random_split(rng, num_test, shape)

    def batch(label: str, images: np.ndarray, labels: np.ndarray) -> bytes:
        entry = {
            # One row per image: the red plane, then green, then blue, each row-major.
            "data": images.reshape(len(images), 3 * 32 * 32),
            "labels": [int(y) for y in labels],
            "batch_label": label,
            "filenames": [f"tiny_{label.replace(' ', '_')}_{i}.png" for i in range(len(images))],
        }
        return pickle.dumps(entry, protocol=2)

    contents = {
        name: batch(f"training batch {i} of 5", images, labels)
        for i, (name, (images, labels)) in enumerate(
            zip(CIFAR10_TRAIN_FILES, batches, strict=True), start=1
        )
    }
    contents[CIFAR10_TEST_FILE] = batch("testing batch 1 of 1", test_images, test_labels)
    meta = {
        "num_cases_per_batch": num_train_per_batch,
        "label_names": list(CIFAR10_CLASSES),
        "num_vis": 3 * 32 * 32,
    }
    contents[CIFAR10_META_FILE] = pickle.dumps(meta, protocol=2)
    tiny = TinyDataset(
        train_images=np.concatenate([images for images, _ in batches]),
        train_labels=np.concatenate([labels for _, labels in batches]),
        test_images=test_images,
        test_labels=test_labels,
        md5s={name: md5(data) for name, data in contents.items()},
    )
    return contents, tiny


def write_cifar10(
    root: Path, num_train_per_batch: int = 4, num_test: int = 6, seed: int = 0
) -> TinyDataset:
    """`<root>/cifar-10-batches-py/` with `data_batch_1..5`, `test_batch` and `batches.meta`.

    torchvision checks every file's md5: patch `CIFAR10.train_list`, `.test_list` and `.meta`
    with `md5s` (see `cifar10_md5_lists`).
    """
    contents, tiny = _cifar10_files(num_train_per_batch, num_test, seed)
    folder = Path(root) / CIFAR10_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in contents.items():
        (folder / name).write_bytes(data)
    return tiny


def write_cifar10_archive(
    folder: Path, num_train_per_batch: int = 4, num_test: int = 6, seed: int = 0
) -> tuple[TinyDataset, str]:
    """`<folder>/cifar-10-python.tar.gz` holding `cifar-10-batches-py/...`; returns its md5 too."""
    contents, tiny = _cifar10_files(num_train_per_batch, num_test, seed)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in contents.items():
            info = tarfile.TarInfo(f"{CIFAR10_FOLDER}/{name}")
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    archive = buffer.getvalue()
    (folder / CIFAR10_ARCHIVE).write_bytes(archive)
    return tiny, md5(archive)


def cifar10_md5_lists(md5s: dict[str, str]) -> dict[str, object]:
    """`CIFAR10.train_list`, `.test_list` and `.meta` with the md5s of tiny files."""
    return {
        "train_list": [[name, md5s[name]] for name in CIFAR10_TRAIN_FILES],
        "test_list": [[CIFAR10_TEST_FILE, md5s[CIFAR10_TEST_FILE]]],
        "meta": {
            "filename": CIFAR10_META_FILE,
            "key": "label_names",
            "md5": md5s[CIFAR10_META_FILE],
        },
    }
