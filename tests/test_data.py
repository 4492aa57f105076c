"""The data modules, offline: scikit-learn's digits, and tiny torchvision files written to tmp_path.

No test contacts an outside address: every torchvision download address is pointed at a closed
port on 127.0.0.1 (autouse fixture), and the download tests serve tiny files from a local
HTTP server.
"""

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf
from torchvision import datasets

from kindling.data.digits import DigitsDataModule
from kindling.data.in_memory import InMemoryImageDataModule
from kindling.data.loaders import per_device_batch_size
from kindling.data.torchvision_datasets import (
    CIFAR10DataModule,
    FashionMNISTDataModule,
    MNISTDataModule,
)
from kindling.errors import UserError

from helpers import PYTHON, compose_in
from torchvision_files import (
    CIFAR10_ARCHIVE,
    CIFAR10_FOLDER,
    MNIST_FILES,
    TinyDataset,
    cifar10_md5_lists,
    write_cifar10,
    write_cifar10_archive,
    write_mnist,
    write_mnist_gz,
)

NUM_DIGITS = 1797
PROXY_VARIABLES = (
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
)


def config_value(config: str, key: str):
    """A value of `data=<config>` (its file, or the _base it extends), as a plain Python object."""
    value = compose_in(Path(), f"data={config}").data[key]
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def as_float_images(images: np.ndarray) -> torch.Tensor:
    """What a data module should read back for uint8 images: float in [0, 1]."""
    return torch.from_numpy(images).float() / 255.0


# --------------------------------------------------------------------------------------------
# Network isolation and a local HTTP server


@pytest.fixture
def closed_port_url() -> Iterator[str]:
    """An http address on 127.0.0.1 that refuses connections at once.

    The socket is bound but never listens, so nothing else can take the port while the test runs
    and a connection attempt is refused immediately (no timeout to wait for).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    yield f"http://127.0.0.1:{port}/"
    sock.close()


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch, closed_port_url: str) -> str:
    """Point every torchvision download address used here at a closed local port, no proxies."""
    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("no_proxy", "*")
    monkeypatch.setenv("NO_PROXY", "*")
    monkeypatch.setattr(datasets.MNIST, "mirrors", [closed_port_url])
    monkeypatch.setattr(datasets.FashionMNIST, "mirrors", [closed_port_url])
    monkeypatch.setattr(datasets.CIFAR10, "url", f"{closed_port_url}{CIFAR10_ARCHIVE}")
    return closed_port_url


# --------------------------------------------------------------------------------------------
# scikit-learn digits


def make_digits(tmp_path: Path, **overrides) -> DigitsDataModule:
    kwargs = {
        "data_dir": str(tmp_path),
        "num_classes": config_value("digits", "num_classes"),
        "image_shape": config_value("digits", "image_shape"),
        "val_fraction": config_value("digits", "val_fraction"),
        "test_fraction": config_value("digits", "test_fraction"),
        "batch_size": 32,  # not the default (64), so a batch of 32 shows the setting is used
        "num_workers": 0,
    }
    return DigitsDataModule(**{**kwargs, **overrides})


@pytest.fixture
def digits(tmp_path: Path) -> DigitsDataModule:
    dm = make_digits(tmp_path)
    dm.setup("fit")
    return dm


def test_digits_splits(digits: DigitsDataModule) -> None:
    train, val, test = digits.data_train, digits.data_val, digits.data_test
    assert len(train) + len(val) + len(test) == NUM_DIGITS
    num_test = round(NUM_DIGITS * 0.2)
    assert len(test) == num_test
    assert len(val) == round((NUM_DIGITS - num_test) * 0.1)
    for dataset in (train, val, test):
        images, labels = dataset.tensors
        assert images.shape[1:] == (1, 8, 8)
        assert images.dtype == torch.float32
        assert labels.dtype == torch.int64
        assert int(labels.min()) >= 0 and int(labels.max()) <= 9
    # Every class appears in training.
    assert set(train.tensors[1].tolist()) == set(range(10))


def test_digits_train_and_val_partition_the_training_split(digits: DigitsDataModule) -> None:
    (_, raw_train_labels), _ = digits.load_splits()
    split_labels = torch.cat([digits.data_train.tensors[1], digits.data_val.tensors[1]])
    assert len(split_labels) == len(raw_train_labels)
    assert torch.equal(
        torch.bincount(split_labels, minlength=10), torch.bincount(raw_train_labels, minlength=10)
    )


def test_digits_val_split_follows_the_seed(tmp_path: Path) -> None:
    modules = {}
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        modules[name] = make_digits(tmp_path, seed=seed)
        modules[name].setup("fit")
    a, b, c = (modules[name] for name in "abc")
    for x, y in zip(a.data_val.tensors, b.data_val.tensors, strict=True):
        assert torch.equal(x, y)
    assert not torch.equal(a.data_val.tensors[1], c.data_val.tensors[1])
    # The test split is fixed, whatever the seed: test numbers compare across seeds.
    assert torch.equal(a.data_test.tensors[1], c.data_test.tensors[1])


def test_digits_are_standardised_with_one_transform(digits: DigitsDataModule) -> None:
    train_images = digits.data_train.tensors[0]
    mean = train_images.mean(dim=(0, 2, 3))
    std = train_images.std(dim=(0, 2, 3))
    torch.testing.assert_close(mean, torch.zeros(1), atol=1e-4, rtol=0)
    torch.testing.assert_close(std, torch.ones(1), atol=1e-4, rtol=0)
    # Raw pixels are k/16 with both 0 and 1 in every split: the same affine map sends them to the
    # same standardised values in all three splits.
    for dataset in (digits.data_val, digits.data_test):
        images = dataset.tensors[0]
        torch.testing.assert_close(images.min(), train_images.min())
        torch.testing.assert_close(images.max(), train_images.max())


def test_digits_batches_have_the_configured_size(digits: DigitsDataModule) -> None:
    images, labels = next(iter(digits.train_dataloader()))
    assert images.shape == (32, 1, 8, 8)
    assert labels.shape == (32,)
    images, _ = next(iter(digits.val_dataloader()))
    assert images.shape[0] == 32


def test_loader_before_setup_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="setup"):
        make_digits(tmp_path).train_dataloader()


@pytest.mark.slow
def test_a_process_that_iterated_a_loader_with_workers_exits(tmp_path: Path) -> None:
    """The workers ignore SIGTERM (a terminal's or scancel's signal reaches them too), the one
    Python's exit ends them with: the script must still end, and without an error."""
    script = (
        "from kindling.data.digits import DigitsDataModule\n"
        "dm = DigitsDataModule('.', num_classes=10, image_shape=[1, 8, 8], num_workers=2)\n"
        "dm.setup('fit')\n"
        "loader = dm.train_dataloader()  # alive at exit, with its workers\n"
        "print(sum(len(labels) for _, labels in loader))\n"
    )
    done = subprocess.run(
        [*PYTHON, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert (done.returncode, done.stdout.strip()) == (0, "1294"), done.stderr
    assert "Error" not in done.stderr, done.stderr


# --------------------------------------------------------------------------------------------
# Global batch size over the processes of a run


@pytest.mark.parametrize(
    ("batch_size", "world_size", "expected"), [(128, 1, 128), (128, 4, 32), (6, 3, 2), (8, 8, 1)]
)
def test_per_device_batch_size(batch_size: int, world_size: int, expected: int) -> None:
    assert per_device_batch_size(batch_size, world_size) == expected


def test_batch_size_that_does_not_divide_is_a_user_error() -> None:
    with pytest.raises(UserError, match="3 processes") as error:
        per_device_batch_size(100, 3)
    assert "data.batch_size" in str(error.value)


@pytest.mark.parametrize("batch_size", [0, -8])
def test_non_positive_batch_size_fails_at_construction(tmp_path: Path, batch_size: int) -> None:
    with pytest.raises(UserError, match=r"data\.batch_size"):
        make_digits(tmp_path, batch_size=batch_size)


@pytest.mark.parametrize("val_fraction", [0.0, 1.0, 1.5, -0.1])
def test_val_fraction_out_of_range_fails_at_construction(
    tmp_path: Path, val_fraction: float
) -> None:
    with pytest.raises(UserError, match=r"data\.val_fraction"):
        make_digits(tmp_path, val_fraction=val_fraction)


def test_batches_are_split_over_the_world_size(tmp_path: Path) -> None:
    dm = make_digits(tmp_path, batch_size=32, shuffle_seed=0)
    dm.trainer = SimpleNamespace(world_size=2, global_rank=0, accelerator=None)
    dm.setup("fit")
    assert dm.batch_size_per_device == 16
    images, _ = next(iter(dm.train_dataloader()))
    assert images.shape[0] == 16


def test_world_size_that_does_not_divide_fails_before_loading(tmp_path: Path) -> None:
    dm = make_digits(tmp_path, batch_size=32)
    dm.trainer = SimpleNamespace(world_size=3, accelerator=None)

    def load_splits():
        pytest.fail("setup loaded the data before checking the batch size")

    dm.load_splits = load_splits
    with pytest.raises(UserError, match="3 processes"):
        dm.setup("fit")


# --------------------------------------------------------------------------------------------
# MNIST, Fashion-MNIST and CIFAR-10 from tiny files in torchvision's layout

TORCHVISION_MODULES = {
    "mnist": MNISTDataModule,
    "fashion_mnist": FashionMNISTDataModule,
    "cifar10": CIFAR10DataModule,
}
TORCHVISION_FOLDERS = {
    "mnist": "MNIST/raw",
    "fashion_mnist": "FashionMNIST/raw",
    "cifar10": CIFAR10_FOLDER,
}
TORCHVISION_FILES = {
    "mnist": list(MNIST_FILES),
    "fashion_mnist": list(MNIST_FILES),
    "cifar10": [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"],
}


def make_torchvision(config: str, data_dir: Path, **overrides) -> InMemoryImageDataModule:
    kwargs = {
        "data_dir": str(data_dir),
        "num_classes": 10,
        "image_shape": config_value(config, "image_shape"),
        "batch_size": 4,
        "num_workers": 0,
        "download": False,
    }
    return TORCHVISION_MODULES[config](**{**kwargs, **overrides})


def patch_cifar10_md5s(monkeypatch: pytest.MonkeyPatch, tiny: TinyDataset) -> None:
    for name, value in cifar10_md5_lists(tiny.md5s).items():
        monkeypatch.setattr(datasets.CIFAR10, name, value)


def write_local(config: str, root: Path, monkeypatch: pytest.MonkeyPatch, **kwargs) -> TinyDataset:
    """Tiny files for `config` where its data module looks under `root`."""
    if config == "cifar10":
        tiny = write_cifar10(root, **kwargs)
        patch_cifar10_md5s(monkeypatch, tiny)
        return tiny
    folder_name = "MNIST" if config == "mnist" else "FashionMNIST"
    return write_mnist(root, folder_name=folder_name, **kwargs)


def assert_reads_back(dm: InMemoryImageDataModule, tiny: TinyDataset) -> None:
    """The data module's splits hold exactly the pixels and labels that were written."""
    (train_images, train_labels), (test_images, test_labels) = dm.load_splits()
    assert torch.equal(train_images, as_float_images(tiny.train_images))
    assert torch.equal(test_images, as_float_images(tiny.test_images))
    assert torch.equal(train_labels, torch.from_numpy(tiny.train_labels))
    assert torch.equal(test_labels, torch.from_numpy(tiny.test_labels))
    # One known pixel, spelled out: image 1, last channel, row 2, column 5.
    expected = tiny.train_images[1, -1, 2, 5] / 255.0
    assert float(train_images[1, -1, 2, 5]) == pytest.approx(expected)


def assert_set_up(dm: InMemoryImageDataModule, tiny: TinyDataset, image_shape: list[int]) -> None:
    assert len(dm.data_train) + len(dm.data_val) == len(tiny.train_labels)
    assert len(dm.data_val) >= 1
    assert len(dm.data_test) == len(tiny.test_labels)
    for dataset in (dm.data_train, dm.data_val, dm.data_test):
        assert tuple(dataset.tensors[0].shape[1:]) == tuple(image_shape)
    # The test split keeps the files' order; train and val share out the training labels.
    assert torch.equal(dm.data_test.tensors[1], torch.from_numpy(tiny.test_labels))
    split_labels = torch.cat([dm.data_train.tensors[1], dm.data_val.tensors[1]])
    assert torch.equal(
        torch.bincount(split_labels, minlength=10),
        torch.bincount(torch.from_numpy(tiny.train_labels), minlength=10),
    )
    # Standardised per channel with the training part's statistics.
    train_images = dm.data_train.tensors[0]
    channels = image_shape[0]
    torch.testing.assert_close(
        train_images.mean(dim=(0, 2, 3)), torch.zeros(channels), atol=1e-4, rtol=0
    )
    torch.testing.assert_close(
        train_images.std(dim=(0, 2, 3)), torch.ones(channels), atol=1e-4, rtol=0
    )
    images, labels = next(iter(dm.train_dataloader()))
    assert images.shape == (4, *image_shape)
    assert labels.shape == (4,)


@pytest.mark.parametrize("download", [False, True], ids=["download-off", "download-on"])
@pytest.mark.parametrize("config", list(TORCHVISION_MODULES))
def test_local_files_load_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str, download: bool
) -> None:
    # With download on, files already there are used: the download address is a closed port.
    tiny = write_local(config, tmp_path, monkeypatch)
    dm = make_torchvision(config, tmp_path, download=download)
    dm.prepare_data()
    dm.setup("fit")
    assert_reads_back(dm, tiny)
    assert_set_up(dm, tiny, config_value(config, "image_shape"))


def test_fashion_mnist_does_not_read_mnist_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_local("mnist", tmp_path, monkeypatch)
    with pytest.raises(UserError, match="FashionMNIST"):
        make_torchvision("fashion_mnist", tmp_path).prepare_data()


def assert_names_folder_and_files(error: UserError, root: Path, config: str) -> None:
    message = str(error)
    assert str(root / TORCHVISION_FOLDERS[config]) in message
    for name in TORCHVISION_FILES[config]:
        assert name in message
    assert "data.download" in message


@pytest.mark.parametrize("config", list(TORCHVISION_MODULES))
def test_missing_files_with_download_off(tmp_path: Path, config: str) -> None:
    dm = make_torchvision(config, tmp_path, download=False)
    with pytest.raises(UserError) as error:
        dm.prepare_data()
    assert_names_folder_and_files(error.value, tmp_path, config)
    assert "download is off" in str(error.value)


@pytest.mark.parametrize("config", list(TORCHVISION_MODULES))
def test_missing_files_with_download_failing(tmp_path: Path, config: str) -> None:
    # The autouse `offline` fixture points the download address at a closed local port.
    dm = make_torchvision(config, tmp_path, download=True)
    start = time.perf_counter()
    with pytest.raises(UserError) as error:
        dm.prepare_data()
    assert time.perf_counter() - start < 5.0, "a refused connection should fail at once"
    assert_names_folder_and_files(error.value, tmp_path, config)
    assert "download failed" in str(error.value)


@pytest.mark.parametrize("config", ["mnist", "cifar10"])
def test_files_named_in_the_error_are_enough(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str
) -> None:
    """Following the message (put these files in this folder) makes an offline run work."""
    staging = tmp_path / "staging"
    write_local(config, staging, monkeypatch)
    if config == "mnist":
        write_mnist_gz(staging / "MNIST" / "raw")  # same seed: the same images, gzipped
    data_dir = tmp_path / "data"
    dm = make_torchvision(config, data_dir, download=False)
    with pytest.raises(UserError):
        dm.prepare_data()
    folder, names = dm.expected_files()
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(staging / TORCHVISION_FOLDERS[config] / name, folder / name)
    dm.prepare_data()


@pytest.mark.parametrize(
    ("config", "image_shape"), [("mnist", [1, 8, 8]), ("cifar10", [1, 32, 32])]
)
def test_image_shape_mismatch_is_a_user_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, config: str, image_shape: list[int]
) -> None:
    write_local(config, tmp_path, monkeypatch)
    dm = make_torchvision(config, tmp_path, image_shape=image_shape)
    dm.prepare_data()
    with pytest.raises(UserError, match=r"data\.image_shape") as error:
        dm.setup("fit")
    assert str(image_shape) in str(error.value)


def test_num_classes_mismatch_is_a_user_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny = write_local("mnist", tmp_path, monkeypatch)
    assert tiny.train_labels.max() >= 5
    dm = make_torchvision("mnist", tmp_path, num_classes=5)
    with pytest.raises(UserError, match=r"data\.num_classes"):
        dm.setup("fit")


# --------------------------------------------------------------------------------------------
# Downloads from a local HTTP server


@pytest.mark.parametrize("config", ["mnist", "fashion_mnist"])
def test_mnist_download(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, serve_folder, config: str
) -> None:
    tiny = write_mnist_gz(tmp_path / "mirror")
    url, requested = serve_folder(tmp_path / "mirror")
    dataset_class = TORCHVISION_MODULES[config].dataset_class
    monkeypatch.setattr(dataset_class, "mirrors", [url])
    monkeypatch.setattr(dataset_class, "resources", list(tiny.md5s.items()))
    data_dir = tmp_path / "data"

    dm = make_torchvision(config, data_dir, download=True)
    dm.prepare_data()
    assert {f"/{name}.gz" for name in MNIST_FILES} <= set(requested)
    raw = data_dir / TORCHVISION_FOLDERS[config]
    for name in MNIST_FILES:
        assert (raw / name).is_file()

    # Once there, the files are not fetched again.
    num_requests = len(requested)
    make_torchvision(config, data_dir, download=True).prepare_data()
    assert len(requested) == num_requests

    dm.setup("fit")
    assert_reads_back(dm, tiny)
    assert_set_up(dm, tiny, [1, 28, 28])


def test_mnist_download_with_wrong_md5_is_a_user_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, serve_folder
) -> None:
    tiny = write_mnist_gz(tmp_path / "mirror")
    url, requested = serve_folder(tmp_path / "mirror")
    monkeypatch.setattr(datasets.MNIST, "mirrors", [url])
    monkeypatch.setattr(datasets.MNIST, "resources", [(name, "0" * 32) for name in tiny.md5s])
    with pytest.raises(UserError, match="download failed") as error:
        make_torchvision("mnist", tmp_path / "data", download=True).prepare_data()
    assert requested, "the server was not asked for anything"
    assert_names_folder_and_files(error.value, tmp_path / "data", "mnist")


def test_cifar10_download(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, serve_folder) -> None:
    tiny, archive_md5 = write_cifar10_archive(tmp_path / "mirror")
    url, requested = serve_folder(tmp_path / "mirror")
    monkeypatch.setattr(datasets.CIFAR10, "url", f"{url}{CIFAR10_ARCHIVE}")
    monkeypatch.setattr(datasets.CIFAR10, "filename", CIFAR10_ARCHIVE)
    monkeypatch.setattr(datasets.CIFAR10, "tgz_md5", archive_md5)
    patch_cifar10_md5s(monkeypatch, tiny)
    data_dir = tmp_path / "data"

    dm = make_torchvision("cifar10", data_dir, download=True)
    dm.prepare_data()
    assert f"/{CIFAR10_ARCHIVE}" in requested
    for name in TORCHVISION_FILES["cifar10"]:
        assert (data_dir / CIFAR10_FOLDER / name).is_file()

    num_requests = len(requested)
    make_torchvision("cifar10", data_dir, download=True).prepare_data()
    assert len(requested) == num_requests

    dm.setup("fit")
    assert_reads_back(dm, tiny)
    assert_set_up(dm, tiny, [3, 32, 32])


def test_device_loader_shards_shuffles_and_follows_the_epoch() -> None:
    from kindling.data.device_loader import DeviceTensorLoader

    images, labels = torch.arange(20.0).reshape(20, 1), torch.arange(20)
    ranks = [
        DeviceTensorLoader((images, labels), 3, shuffle=True, rank=r, world_size=2, seed=5)
        for r in (0, 1)
    ]
    seen = [torch.cat([b[1] for b in loader]) for loader in ranks]
    assert [len(loader) for loader in ranks] == [4, 4]  # 10 samples per rank, batches of 3
    # What a DataLoader's callers read: the whole set, and this rank's share of it.
    assert [(len(r.dataset), r.sampler.num_samples) for r in ranks] == [(20, 10), (20, 10)]
    # The ranks split one permutation: disjoint, together every sample once.
    assert sorted(torch.cat(seen).tolist()) == list(range(20))
    for batch_images, batch_labels in ranks[0]:
        assert torch.equal(batch_images[:, 0].long(), batch_labels)  # rows stay together
    # The same epoch gives the same order; another epoch another one.
    assert torch.equal(torch.cat([b[1] for b in ranks[0]]), seen[0])
    ranks[0].set_epoch(1)
    assert not torch.equal(torch.cat([b[1] for b in ranks[0]]), seen[0])
    ordered = DeviceTensorLoader((images, labels), 8, shuffle=False, drop_last=True)
    assert [b[1].tolist() for b in ordered] == [list(range(8)), list(range(8, 16))]


def test_on_device_data_trains_like_the_dataloader_path(tmp_path) -> None:
    """Same model, same data: with the data on the device the loss curve is the same shape."""
    import lightning as L

    from kindling.models.cnn import CNNClassifier
    from kindling.modules.classifier import Classifier

    losses = {}
    for on_device in (False, True):
        L.seed_everything(0)
        dm = DigitsDataModule(
            data_dir=str(tmp_path), num_classes=10, image_shape=[1, 8, 8], batch_size=64,
            on_device=on_device,
        )  # fmt: skip
        module = Classifier(
            CNNClassifier((1, 8, 8), 10, channels=[8, 16], dropout=0.0), 10,
            optimizer=lambda params: torch.optim.SGD(params, lr=0.05),
        )  # fmt: skip
        trainer = L.Trainer(
            accelerator="cpu", max_epochs=3, logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        trainer.fit(module, datamodule=dm)
        losses[on_device] = float(trainer.callback_metrics["val/loss"])
    # Shuffling differs (two generators), the learning does not: both fall far below log(10).
    assert losses[True] < 1.0 and losses[False] < 1.0, losses
    assert abs(losses[True] - losses[False]) < 0.25, losses


@pytest.mark.parametrize(("world_size", "warned"), [(2, True), (1, False)])
def test_workers_beside_other_ranks_warn_where_python_can_hang_in_fork(
    monkeypatch: pytest.MonkeyPatch, world_size: int, warned: bool
) -> None:
    """python/cpython#112275: on the Pythons it affects, a multi-process run with loader workers
    says how to avoid the hang, once per loader; one process, or no workers, says nothing."""
    import warnings

    from kindling.data import workers

    monkeypatch.setattr(workers, "FORK_CAN_HANG", True)
    datamodule = DigitsDataModule(
        data_dir="unused", num_classes=10, image_shape=[1, 8, 8], num_workers=1
    )
    datamodule.trainer = SimpleNamespace(world_size=world_size, accelerator=None, num_devices=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        datamodule.loader_options(torch.utils.data.TensorDataset(torch.zeros(4)), drop_last=False)
    said = [str(w.message) for w in caught if "python/cpython#112275" in str(w.message)]
    assert len(said) == warned, said
    if warned:
        assert "data.num_workers=0" in said[0] and "3.11.10" in said[0]
