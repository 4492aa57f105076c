"""Your own images: a folder of image files, decoded in workers, batched as uint8."""

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import DataLoader

from kindling.config.errors import UserError
from kindling.data.augment import Transform, worker_transform
from kindling.data.folder import Samples, files_to_predict, read_image_folder
from kindling.data.gpu_decode import EncodedImageFiles, check_decode_device, decode_batch
from kindling.data.image_files import ImageFiles, readable
from kindling.data.loaders import PREDICT_SPLITS, SplitDataModule, per_device_batch_size
from kindling.data.normalize import cached_statistics, channel_statistics, to_model_input
from kindling.data.splits import check_folds, split_off

log = logging.getLogger(__name__)

STATISTICS_FILE = ".kindling_statistics.json"  # beside the data, in data.path


class ImageFolderDataModule(SplitDataModule):
    """Image files in torchvision's ImageFolder layout, for classification.

    `<path>/<class>/<files>`, or `<path>/train/<class>/<files>` with optional `val/` and `test/`
    beside it; an absent split is carved from train with `seed`. Class names are the folder
    names, sorted; they are stored in checkpoints with the normalisation statistics.

    Workers decode each file (torchvision.io, PIL for other formats), resize it to
    `image_size`, convert it to `channels` and apply `augment` (training only); batches cross
    to the device as uint8 and are converted and standardised there (`on_after_batch_transfer`).

    Args:
        path: the image folder.
        num_classes: the number of classes; must match the class folders.
        image_size: height and width every image is resized to.
        channels: 1 (grey) or 3 (RGB); other modes are converted.
        image_shape: `[channels, image_size, image_size]`, for the model config; checked.
        batch_size: the global batch size, divided evenly over the processes of a run.
        val_fraction: share of train held out for validation when there is no `val/`.
        test_fraction: share of train held out for testing when there is no `test/`.
        seed: seed of the carved splits (and folds) and of the statistics' sample.
        folds, fold: k-fold cross-validation, without a `val/` folder: what train keeps after the
            test split is cut into `folds` stratified, seeded folds (kindling.data.splits); fold
            `fold` is validation, the others train (`val_fraction` is then unused).
        augment: training-time transforms (torchvision.transforms.v2, applied to uint8 images).
        mean: per-channel mean in [0, 1] units; null: measured on the training split.
        std: per-channel standard deviation; null: measured with `mean`.
        statistics_sample: how many training images the statistics are measured on; cached in
            `<path>/.kindling_statistics.json` for the next run.
        unreadable: `skip` (a file that cannot be decoded is replaced by the next one and named
            in a warning) or `check` (decode every file before training; refuse with the list).
        num_workers: DataLoader worker processes per device; null: the CPUs available to this
            process shared by the processes of this machine.
        pin_memory: page-locked host batches for faster copies (used only on CUDA).
        persistent_workers: keep workers alive between epochs (when there are workers).
        prefetch_factor: batches each worker prepares ahead (when there are workers).
        drop_last: drop the last, partial training batch.
        decode_device: `cpu` (workers decode) or `cuda` (workers read file bytes; JPEGs are
            decoded on the GPU, in batches, with nvJPEG).
    """

    def __init__(
        self,
        path: str,
        num_classes: int,
        image_size: int = 64,
        channels: int = 3,
        image_shape: Sequence[int] | None = None,
        batch_size: int = 64,
        val_fraction: float = 0.1,
        test_fraction: float = 0.1,
        seed: int = 0,
        augment: Mapping[str, Transform | None] | None = None,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        statistics_sample: int = 1000,
        unreadable: str = "skip",
        num_workers: int | None = None,
        pin_memory: bool = True,
        persistent_workers: bool = True,
        prefetch_factor: int = 2,
        drop_last: bool = True,
        decode_device: str = "cpu",
        folds: int | None = None,
        fold: int | None = None,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["augment"], logger=False)
        per_device_batch_size(batch_size, 1)
        if channels not in (1, 3):
            raise UserError(f"data.channels must be 1 (grey) or 3 (RGB), got {channels}.")
        expected = [channels, image_size, image_size]
        if image_shape is not None and list(image_shape) != expected:
            raise UserError(
                f"data.image_shape={list(image_shape)} disagrees with data.channels={channels} "
                f"and data.image_size={image_size}: set those two; image_shape follows them."
            )
        if unreadable not in ("skip", "check"):
            raise UserError(f"data.unreadable must be skip or check, got {unreadable!r}.")
        if (mean is None) != (std is None):
            raise UserError("Give data.mean and data.std together, or neither (measured).")
        check_decode_device(decode_device)
        check_folds(folds, fold)
        self.transform = worker_transform(augment)
        self.classes: list[str] | None = None
        self.mean: torch.Tensor | None = None  # (1, C, 1, 1), [0, 1] units
        self.std: torch.Tensor | None = None
        self._on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def setup(self, stage: str | None = None) -> None:
        hp = self.hparams
        if stage == "predict" and self.predict_input not in PREDICT_SPLITS:  # image files
            self.data_predict, self.names_to_predict = files_to_predict(
                self.predict_input, hp.channels, hp.image_size
            )
            return
        if self.data_train is not None:
            return
        self.batch_size_per_device  # noqa: B018 - validate before reading any file
        folder = read_image_folder(hp.path)
        if len(folder.classes) != hp.num_classes:
            raise UserError(
                f"data.num_classes={hp.num_classes} but {hp.path} has {len(folder.classes)} "
                f"class folders ({', '.join(folder.classes)}). Set data.num_classes="
                f"{len(folder.classes)}, or leave it out: it is counted from the folders."
            )
        self._check_classes(folder.classes)
        self.classes = folder.classes
        splits = self._splits(folder.splits)
        # GPU decoding cannot skip a bad file inside a batch: it always checks first.
        if hp.unreadable == "check" or hp.decode_device == "cuda":
            self._check_readable([f for samples in splits.values() for f, _ in samples])

        files = EncodedImageFiles if hp.decode_device == "cuda" else ImageFiles
        size, channels = hp.image_size, hp.channels
        self.data_train = files(splits["train"], channels, size, transform=self.transform)
        self.data_val = files(splits["val"], channels, size)
        self.data_test = files(splits["test"], channels, size)
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
        loader = DataLoader(
            files, batch_size=64, num_workers=self.num_workers, collate_fn=self._unreadable
        )
        bad = [path for batch in loader for path in batch]
        if bad:
            shown = "\n  ".join(str(p) for p in bad[:20])
            more = f"\n  ... and {len(bad) - 20} more" if len(bad) > 20 else ""
            raise UserError(
                f"{len(bad)} image files cannot be decoded:\n  {shown}{more}\n"
                "Remove or replace them, or set data.unreadable=skip to train without them."
            )

    def _unreadable(self, files: list[Path]) -> list[Path]:
        return [f for f in files if not readable(f, self.hparams.channels)]

    def _set_statistics(self, train: ImageFiles) -> None:
        hp = self.hparams
        if hp.mean is not None:
            mean, std = list(hp.mean), list(hp.std)
        else:
            key = (
                f"{hp.channels}x{hp.image_size}, {len(train)} images, sample {hp.statistics_sample}"
            )
            cache = Path(hp.path) / STATISTICS_FILE
            mean, std = cached_statistics(
                cache, key, lambda: channel_statistics(train, hp.statistics_sample, hp.seed)
            )
        if len(mean) != hp.channels or len(std) != hp.channels:
            raise UserError(
                f"data.mean and data.std need {hp.channels} values (one per channel); "
                f"got {len(mean)} and {len(std)}."
            )
        self.mean = torch.tensor(mean).view(1, -1, 1, 1)
        self.std = torch.tensor(std).view(1, -1, 1, 1)

    def _check_classes(self, found: list[str]) -> None:
        """The folders' classes must be the checkpoint's (known when it was loaded first)."""
        trained = self.classes
        if trained is not None and found != trained:
            raise UserError(
                f"{self.hparams.path} has the classes {', '.join(found)}, but the checkpoint was "
                f"trained on {', '.join(trained)}. Use a folder with the checkpoint's classes."
            )

    def train_dataloader(self) -> DataLoader:
        if isinstance(self.data_train, ImageFiles) and self.trainer is not None:
            self.data_train.rank = self.trainer.global_rank
        return super().train_dataloader()

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if self.hparams.decode_device != "cuda" or self.data_predict is not None:
            return batch
        encoded, labels = batch
        transform = self.transform if self.trainer.training else None
        device = self.trainer.strategy.root_device
        hp = self.hparams
        return decode_batch(encoded, device, hp.channels, hp.image_size, transform), labels

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        if not isinstance(batch, list | tuple):  # the model summary's example input
            return batch
        images, *rest = batch  # labels, or a prediction's rows and readable
        if images.device not in self._on_device:  # the statistics, copied once per device
            self._on_device[images.device] = (
                self.mean.to(images.device),
                self.std.to(images.device),
            )
        return [to_model_input(images, *self._on_device[images.device]), *rest]

    def state_dict(self) -> dict[str, Any]:
        # Lightning stores this in every checkpoint: prediction needs no training data.
        return {"mean": self.mean, "std": self.std, "classes": self.classes}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.classes is not None:  # set up on a folder before the checkpoint was loaded
            found, self.classes = self.classes, state_dict["classes"]
            self._check_classes(found)
        self.mean, self.std = state_dict["mean"], state_dict["std"]
        self.classes = state_dict["classes"]
        self._on_device.clear()


def _split(
    samples: Samples, fraction: float, seed: int, folds: int | None = None, fold: int | None = None
) -> tuple[Samples, Samples]:
    labels = torch.tensor([label for _, label in samples])
    rest, held = split_off(labels, fraction, seed, folds=folds, fold=fold)
    return [samples[i] for i in rest.tolist()], [samples[i] for i in held.tolist()]
