"""A prepared copy of an image or sequence data set, streamed by LitData from a folder or object
storage.

`<dir>/kindling.json`, the description `python -m kindling.prepare` writes beside the copy,
holds the format, the kind of samples (`images` or `sequences`), class names, each split's
sample count, the image shape or the feature names, `num_features` and `max_length`, and the
training split's statistics. Written first without `complete` (the folder is kindling's, the
work under way), then with `complete: true` once every split is written.
"""

import functools
import json
import logging
import re
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import fsspec
import torch
from litdata import StreamingDataLoader, StreamingDataset
from litdata.exceptions import ChunkWaitTimeoutError
from torch.utils.data import Dataset

from kindling.data.augment import Transform, worker_transform
from kindling.data.image_folder import LabelledDataModule, files_to_predict
from kindling.data.loaders import SPLITS
from kindling.data.sequences import TABLE_READING, Sequences, standardised, table_to_predict
from kindling.errors import UserError
from kindling.files import probe_writable

log = logging.getLogger(__name__)

METADATA_FILE = "kindling.json"
# A sample: `{"index", "image", "label"}` (uint8 `(C, H, W)`) or, where `kind` is sequences,
# `{"index", "steps", "label"}` (float32 `(T, F)` as the table holds them); 2: each split in a
# seeded random order.
FORMAT = 2
IMAGES, SEQUENCES = "images", "sequences"
OLDER_FORMATS = {1: " (format 1 streams samples in the source's order, nearly sorted by class)"}


def read_metadata(
    input_dir: str, storage_options: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The description of the prepared copy at `input_dir` (a folder or a URL fsspec reads, with
    `storage_options` the S3 client's arguments, as LitData takes them), checked complete."""
    location = f"{input_dir.rstrip('/')}/{METADATA_FILE}"
    again = f"python -m kindling.prepare data=<data config> output={input_dir}"
    # s3fs's options: short timeouts and one retry (an unreachable address is named in under a
    # second, not after botocore's four retries with back-off, 3 to 8 s); a new client, with
    # the credentials and endpoint of now. Other file systems take their own keyword arguments.
    options = {}
    if location.startswith("s3://"):
        botocore = {"connect_timeout": 10, "read_timeout": 10, "retries": {"max_attempts": 1}}
        options = {"client_kwargs": storage_options or {}, "config_kwargs": botocore}
    try:
        with fsspec.open(location, skip_instance_cache=True, **options) as file:
            text = file.read()
    except FileNotFoundError as error:
        raise UserError(
            f"data.input_dir={input_dir} is not a prepared copy (no {METADATA_FILE}). Write "
            f"one with: {again}"
        ) from error
    except Exception as error:  # the storage's own (s3fs: botocore's), named in one line
        raise UserError(unreadable(location, error)) from error
    try:
        metadata = json.loads(text)
    except ValueError as error:
        raise UserError(
            f"{location} is damaged ({error}). Prepare the data again into an empty folder."
        ) from error
    if metadata.get("format") != FORMAT:
        raise UserError(
            f"data.input_dir={input_dir} was prepared by kindling "
            f"{metadata.get('kindling_version', '(unknown)')} (format {metadata.get('format')}); "
            f"this kindling reads format {FORMAT}{OLDER_FORMATS.get(metadata.get('format'), '')}. "
            f"Prepare it again: {again}"
        )
    if not metadata.get("complete"):
        raise UserError(
            f"data.input_dir={input_dir} is an unfinished prepare (it was interrupted). "
            f"Run it again to finish: {again}"
        )
    return metadata


def check_chunks(input_dir: str) -> None:
    """Every chunk file that each split's LitData `index.json` names is there, with at least the
    bytes it records: LitData would wait for a deleted or cut-short chunk mid-epoch, then stop
    with a timeout that blames a download. A copy on object storage is checked as it is read."""
    if "://" in input_dir:
        return
    for split in SPLITS:
        folder = Path(input_dir) / split
        index = folder / "index.json"
        try:
            chunks = json.loads(index.read_text())["chunks"]
        except (OSError, ValueError, KeyError, TypeError) as error:
            raise UserError(damaged(index, "cannot be read", input_dir)) from error
        for chunk in chunks:
            path, recorded = folder / chunk["filename"], chunk.get("chunk_bytes")
            if not path.is_file():
                raise UserError(damaged(path, "is missing", input_dir))
            size = path.stat().st_size
            if recorded is not None and size < recorded:
                raise UserError(
                    damaged(path, f"is cut short ({size} of its {recorded} bytes)", input_dir)
                )


def damaged(path: Path | str, what: str, input_dir: str) -> str:
    return (
        f"{path} {what}: the prepared copy data.input_dir={input_dir} is damaged. Prepare it "
        "again into an empty folder: python -m kindling.prepare data=<data config> "
        "output=<empty folder>"
    )


def unreadable(location: str, error: Exception) -> str:
    credentials = (
        "credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, ~/.aws/credentials "
        "(AWS_PROFILE) or the machine's role"
    )
    if type(error).__name__ == "NoCredentialsError":
        return f"No credentials for {location}: {credentials}."
    if isinstance(error, PermissionError):
        return f"{location} refused ({error}): these credentials may not read it; {credentials}."
    if isinstance(error, ImportError):  # the file system's package (s3fs for s3://)
        return f"data.input_dir: {error}"
    return (
        f"{location} cannot be reached ({error}). Check the network, the address, and the "
        "endpoint (AWS_ENDPOINT_URL or data.storage_options.endpoint_url)."
    )


@contextmanager
def chunks_named(dataset: StreamingDataset) -> Iterator[None]:
    """A chunk LitData waited for in vain (gone, cut short, or never downloaded), or whose
    header it finds at odds with index.json, named in one line: LitData's own timeout blames a
    hung download."""
    split = dataset.input_dir.url or dataset.input_dir.path
    try:
        yield
    except ChunkWaitTimeoutError as error:
        chunk = f"{split}/{Path(error.path).name}"
        what = (
            f"could not be read in {error.waited_s:.0f} s (missing or cut short; on object "
            "storage, its download may have failed)"
        )
        raise UserError(damaged(chunk, what, split.rsplit("/", 1)[0])) from error
    except RuntimeError as error:
        found = re.search(r"does not match index\.json .* for (\S+)\.$", str(error))
        if found is None:
            raise
        chunk = f"{split}/{Path(found.group(1)).name}"
        what = "does not match its index.json (its bytes were changed)"
        raise UserError(damaged(chunk, what, split.rsplit("/", 1)[0])) from error


class PreparedSplit(StreamingDataset):
    """One split of a prepared copy, whose damaged chunks are named: `(image, label)`, or
    `(steps, label)` of sequences served as `Sequences` serves them (with `mean` and `std`).

    A training image's augmentation is seeded by `augment_seed`, the epoch and the sample's
    index, not by which worker or process reads it: a resumed run sees the very images an
    uninterrupted one would.
    """

    def __init__(self, *args: Any, augment: Transform | None = None, augment_seed: int = 0,
                 mean: torch.Tensor | None = None, std: torch.Tensor | None = None,
                 **kwargs: Any):  # fmt: skip
        super().__init__(*args, **kwargs)
        self.augment, self.augment_seed, self.mean, self.std = augment, augment_seed, mean, std
        if mean is not None:  # sequences of different lengths
            self.collate = Sequences.collate

    def __iter__(self) -> "PreparedSplit":
        with chunks_named(self):  # the first chunks are read here, ahead of the samples
            return super().__iter__()

    def __getitem__(self, index: Any) -> tuple[torch.Tensor, Any]:
        with chunks_named(self):
            sample = super().__getitem__(index)
        if "steps" in sample:
            return standardised(sample["steps"], self.mean, self.std), torch.tensor(sample["label"])
        image = sample["image"]
        if self.augment is not None:
            seed = hash((self.augment_seed, self.current_epoch, sample["index"])) % 2**63
            with torch.random.fork_rng(devices=[]):  # leaves the process's own draws alone
                # The CPU generator alone: torch.manual_seed also queues a seed for every
                # accelerator, with a traceback each time (most of the time of a small sample).
                torch.default_generator.manual_seed(seed)
                image = self.augment(image)
        return image, sample["label"]


class StreamingDataModule(LabelledDataModule):
    """The splits `python -m kindling.prepare` wrote, of images or sequences, streamed with LitData.

    Every process of a multi-device run reads its own part of each epoch, all the same number
    of batches. The train loader's position is saved in checkpoints (by Lightning, restored by
    `ResumeExactly`): a run resumed mid-epoch reads exactly the samples the interrupted one had
    left. Images cross to the device as uint8 and are standardised there. Its arguments are
    configs/data/streaming.yaml's keys; those left null that describe the data are read from
    the copy, those given are checked against it.
    """

    def __init__(
        self,
        input_dir: str,
        num_classes: int | None = None,
        image_shape: Sequence[int] | None = None,
        num_features: int | None = None,
        max_length: int | None = None,
        batch_size: int = 64,
        cache_dir: str | None = None,
        max_cache_size: str | None = None,
        storage_options: Mapping[str, Any] | None = None,
        shuffle_seed: int | None = None,
        augment: Mapping[str, Transform | None] | None = None,
        num_workers: int | None = None,
        pin_memory: bool = True,
        prefetch_factor: int = 2,
    ):
        super().__init__()
        self.save_hyperparameters(ignore=["augment"])
        self.transform = worker_transform(augment)
        self.storage_options = dict(storage_options or {})
        self.features: list[str] | None = None  # sequences: the table's features, and how it was
        self.table_reading: dict[str, Any] | None = None  # read (what kindling.predict reads)

    @functools.cached_property
    def metadata(self) -> dict[str, Any]:
        return read_metadata(self.hparams.input_dir, self.storage_options)

    @property
    def kind(self) -> str:
        return self.metadata.get("kind", IMAGES)  # the first copies held images only

    def describe(self) -> dict[str, Any]:  # None where the copy's kind has no value
        keys = ("image_shape", "num_features", "max_length")
        return {"num_classes": len(self.metadata["classes"])} | {
            key: self.metadata.get(key) for key in keys
        }

    def inputs_to_predict(self, path: str) -> tuple[Dataset, list[str]]:
        if self.features:  # a new table, read as the copy's was (a checkpoint's `table_reading`)
            return table_to_predict(path, self.table_reading, self.features, self.mean, self.std)
        channels, size = self.hparams.image_shape[:2]  # image files
        return files_to_predict(path, channels, size)

    def setup_splits(self) -> None:
        hp, metadata = self.hparams, self.metadata
        for key, value in self.describe().items():
            given = list(hp[key]) if isinstance(hp[key], Sequence) else hp[key]
            if given is not None and given != value:
                raise UserError(
                    f"data.{key}={given} but {hp.input_dir} holds {self.kind} with {key} "
                    f"{value}. Leave data.{key} out: it is read from the prepared copy (prepare "
                    "again to change it)."
                )
        if self.transform is not None and self.kind == SEQUENCES:
            raise UserError(
                f"data.augment transforms images, and {hp.input_dir} holds sequences. Leave "
                "data.augment out (data/augment=none)."
            )
        world_size = self.trainer.world_size if self.trainer is not None else 1
        for name in SPLITS:
            count = metadata["splits"][name]
            if world_size > 1 and count < world_size * self.batch_size_per_device:
                raise UserError(
                    f"{hp.input_dir}: the {count} {name} samples are fewer than one batch on each "
                    f"of {world_size} processes (data.batch_size={hp.batch_size}), which take "
                    f"whole batches only. Set data.batch_size={count // world_size * world_size} "
                    "or less, or run on one process."
                )
        check_chunks(hp.input_dir)
        self.check_classes(metadata["classes"], self.classes)
        self.classes, self.features = metadata["classes"], metadata.get("features")
        if self.kind == SEQUENCES:
            self.table_reading = {key: metadata["source"][key] for key in TABLE_READING}
        if self.mean is None:
            shape = (-1,) if self.kind == SEQUENCES else (1, -1, 1, 1)
            self.mean = torch.tensor(metadata["mean"]).view(shape)
            self.std = torch.tensor(metadata["std"]).view(shape)
        seed = self.shuffle_seed
        served = {"mean": self.mean, "std": self.std} if self.kind == SEQUENCES else {}

        def split(name: str, **kwargs: Any) -> PreparedSplit:
            return PreparedSplit(
                f"{hp.input_dir.rstrip('/')}/{name}",
                cache_dir=self._cache_dir(name),
                max_cache_size=hp.max_cache_size,
                storage_options=self.storage_options,
                # Per item: with shuffling, LitData's windowed decoding of small samples decodes
                # whole windows again and again.
                batch_decode=0,
                **served,
                **kwargs,
            )

        self.data_train = split(
            "train", shuffle=True, seed=seed, augment=self.transform, augment_seed=seed
        )
        self.data_val = split("val")
        self.data_test = split("test")
        counts = ", ".join(f"{name} {count}" for name, count in metadata["splits"].items())
        log.info("%s: %d classes; %s: %s.", hp.input_dir, len(self.classes), self.kind, counts)

    def _cache_dir(self, split: str) -> str | None:
        """The split's cache folder, checked writable (LitData would fail in its workers)."""
        if self.hparams.cache_dir is None:
            return None
        folder = Path(self.hparams.cache_dir) / split
        try:
            folder.mkdir(parents=True, exist_ok=True)
            probe_writable(folder)
        except OSError as error:
            raise UserError(
                f"data.cache_dir={self.hparams.cache_dir} is not writable ({error.strerror}). "
                "Set data.cache_dir to a folder you can write to, with room for the cache."
            ) from error
        return str(folder)

    def _loader(self, dataset: PreparedSplit | None, shuffle: bool = False, sampler: Any = None,
                drop_last: bool = False) -> StreamingDataLoader:  # fmt: skip
        if not isinstance(dataset, PreparedSplit):  # a new table to predict: a plain loader
            return super()._loader(dataset, shuffle, sampler, drop_last)
        # LitData shuffles and shares out each epoch itself (the data set's `shuffle`, `seed`):
        # `shuffle` marks the training loader, which drops its last partial batch (BatchNorm,
        # compiled shapes) unless it is the only one (on one process: setup refuses more).
        # Several processes evaluate whole batches, as many each: under DDP a model with buffers
        # (BatchNorm) synchronises them every step, and one extra batch would hang the run.
        several = self.trainer is not None and self.trainer.world_size > 1
        drop_last = several or (shuffle and len(dataset) >= self.batch_size_per_device)
        # Each new iterator draws its workers' base seed from this generator, not from the
        # process's: a resumed run makes an iterator the uninterrupted one did not, and its
        # dropout masks would differ. (Samples are augmented with seeds of their own.)
        options = self.loader_options(dataset, drop_last)
        return StreamingDataLoader(dataset, generator=torch.Generator(), **options)

    @property
    def fixed_batch_shapes(self) -> bool:
        return self.hparams.image_shape is not None  # a copy of sequences is padded per batch

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.features is not None:  # sequences: what kindling.predict reads from a table
            state["features"], state["table_reading"] = self.features, self.table_reading
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        super().load_state_dict(state_dict)
        self.features = state_dict.get("features", self.features)
        self.table_reading = state_dict.get("table_reading", self.table_reading)
        # Lightning loads a checkpoint's state after `setup`: sequences, standardised in the
        # workers, are served with its statistics (images are standardised with `self.mean`).
        for split in (self.data_train, self.data_val, self.data_test):
            if split is not None and split.mean is not None:
                split.mean, split.std = self.mean, self.std
