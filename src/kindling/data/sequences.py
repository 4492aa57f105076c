"""Your own sequences: variable-length time series from a long table (one row per time step,
CSV or Parquet), read and checked, padded per batch; batches of similar lengths on request
(less padding; each epoch still a fair random draw of the set)."""

import functools
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset

from kindling.data.loaders import SPLITS, ResumableDistributedSampler, SplitDataModule, split_off
from kindling.errors import UserError

log = logging.getLogger(__name__)

# The data config keys that say how a table is read: the names of its special columns (every
# other column is a numeric feature; time and split are optional) and what a missing value does.
TABLE_READING = ("id_column", "label_column", "time_column", "split_column", "missing")


@dataclass
class SequenceTable:
    """The table's sequences: features `(T_i, F)` (NaN where a value is missing), class indices
    into `classes`, and each sequence's split (train where the table has no split column)."""

    ids: list[Any]
    sequences: list[torch.Tensor]
    labels: torch.Tensor
    classes: list[str]
    splits: list[str]
    features: list[str]


def read_sequence_table(
    path: str | Path, reading: Mapping[str, Any], trained: list[str] | None = None
) -> SequenceTable:
    """Group the rows into sequences, ordered by id, their steps by the time column if present
    (`reading`: the TABLE_READING keys' values), and check them. `trained`: the features a
    checkpoint was trained on, to predict the table (`input=`): its label and split columns are
    optional and ignored, its features are those, in that order, and its sequences come in the
    order their ids first appear; their labels are their rows."""
    import pyarrow  # only where tables are read
    import pyarrow.csv
    import pyarrow.parquet

    path = Path(path)
    where = f"{'data.path' if trained is None else 'input'}={path}"

    def column(name: str) -> np.ndarray:  # each row's value; a row without one is refused
        values = np.asarray(table.column(name).to_pylist(), dtype=object)
        missing = np.flatnonzero([v is None for v in values])
        if len(missing):
            raise UserError(
                f"{where}: row {missing[0] + 1} has no {name!r} value. Give every row one."
            )
        return values

    def one_per_sequence(values: np.ndarray, what: str) -> np.ndarray:  # rows must agree
        disagree = np.flatnonzero(values[first_rows][group] != values)
        if len(disagree):
            row = disagree[0]
            first_row = first_rows[group[row]]
            raise UserError(
                f"{where}: sequence {ids[group[row]]!r} has rows with {what}s "
                f"{values[first_row]!r} and {values[row]!r} (rows {first_row + 1} and {row + 1}). "
                f"Give each sequence one {what}."
            )
        return values[first_rows]

    if not path.is_file():
        raise UserError(f"{where}: no such file. Give a CSV or Parquet table.")
    try:
        parquet = path.suffix.lower() in (".parquet", ".pq")
        table = pyarrow.parquet.read_table(path) if parquet else pyarrow.csv.read_csv(path)
    except pyarrow.ArrowInvalid as error:
        if "Empty CSV file" in str(error):
            raise UserError(f"{where} is empty: it has no header and no rows.") from None
        raise UserError(f"{where} cannot be read as a table: {error}") from None
    if table.num_rows == 0:
        raise UserError(f"{where} has no rows. Give one row per time step.")
    columns = table.column_names
    fix = "Add it: the checkpoint was trained on a table with it." if trained else None
    for key in ("id_column",) if trained else ("id_column", "label_column"):
        if reading[key] not in columns:
            raise UserError(
                f"{where} has no column {reading[key]!r} (columns: {', '.join(columns)}). "
                f"{fix or f'Add it, or name the column with data.{key}=<column>.'}"
            )
    label_column, time_column, split_column = (
        reading[key] if reading[key] in columns else None
        for key in ("label_column", "time_column", "split_column")
    )
    special = {reading["id_column"], label_column, time_column, split_column} - {None}
    features = [name for name in columns if name not in special]
    if not features:
        raise UserError(f"{where} has no feature columns, only {', '.join(special)}.")
    for name in [*trained, *features] if trained else ():  # the trained features, no others
        if name not in features:
            raise UserError(
                f"{where} has no feature column {name!r}, which the checkpoint was trained on "
                f"(features: {', '.join(trained)}). Add it."
            )
        if name not in trained:
            raise UserError(
                f"{where} has a column {name!r} that is not a feature the checkpoint was trained "
                f"on (features: {', '.join(trained)}), nor its id, label, time or split column. "
                "Drop it."
            )
    features = trained or features
    values = np.empty((table.num_rows, len(features)))  # float64; missing values NaN
    for j, name in enumerate(features):
        read = table.column(name)
        if pyarrow.types.is_integer(read.type) or pyarrow.types.is_floating(read.type):
            values[:, j] = read.to_numpy(zero_copy_only=False)
            continue
        for i, value in enumerate(read.to_pylist()):
            try:
                values[i, j] = np.nan if value is None else float(value)
            except (TypeError, ValueError):
                raise UserError(
                    f"{where}: column {name!r} row {i + 1} holds {value!r}, not a number. Every "
                    "column but the id, time, label and split columns is a feature: fix the "
                    "value, or drop the column."
                ) from None

    # Each row's sequence, and the file row where each sequence first appears.
    row_ids = column(reading["id_column"])
    ids, first_rows, group = np.unique(row_ids, return_index=True, return_inverse=True)
    within = np.arange(len(group)) if time_column is None else column(time_column)
    order = np.lexsort((within.astype(float), group))  # by sequence, then by time (or file row)
    real_rows = np.bincount(group, weights=~np.isnan(values).all(axis=1), minlength=len(ids))
    empty = np.flatnonzero(real_rows == 0)
    if len(empty):
        rows = np.flatnonzero(group == empty[0]) + 1
        raise UserError(
            f"{where}: sequence {ids[empty[0]]!r} is empty (rows {rows.tolist()[:5]} "
            "have no feature values). Give it its values, or remove its rows."
        )
    if reading["missing"] == "refuse" and np.isnan(values).any():
        row, col = np.argwhere(np.isnan(values))[0]
        remedy = (
            "the checkpoint was trained with data.missing=refuse" if trained
            else "set data.missing=mean to fill missing values with the training mean"
        )  # fmt: skip
        raise UserError(
            f"{where}: column {features[col]!r} row {row + 1} is empty or NaN. Fill it, or "
            f"{remedy}."
        )
    steps = torch.from_numpy(values[order].astype(np.float32))
    sequences = list(torch.split(steps, np.bincount(group, minlength=len(ids)).tolist()))
    if trained:  # in the order the ids first appear; their labels: their rows
        appearance = np.argsort(first_rows)
        sequences = [sequences[i] for i in appearance]
        return SequenceTable(
            ids[appearance].tolist(), sequences, torch.arange(len(ids)), [], [], features
        )

    labels = one_per_sequence(column(label_column), "label")
    # Integer labels sort as numbers, any others as text.
    integers = all(isinstance(label, int) for label in labels.tolist())
    classes, labels = np.unique(labels if integers else labels.astype(str), return_inverse=True)
    splits = ["train"] * len(ids)
    if split_column is not None:
        split_rows = column(split_column)
        unknown = sorted(set(split_rows.tolist()) - set(SPLITS))
        if unknown:
            raise UserError(
                f"{where}: column {split_column!r} holds {unknown[0]!r}; "
                "its values are train, val or test."
            )
        splits = one_per_sequence(split_rows, "split").tolist()
    classes = classes.astype(str).tolist()
    return SequenceTable(ids.tolist(), sequences, torch.tensor(labels), classes, splits, features)


class LengthBucketSampler(ResumableDistributedSampler):
    """`ResumableDistributedSampler`'s epochs (every sample as often, seeded, this process's share,
    resumable mid-epoch) in batches of similar lengths: pools of `pool_batches` global batches
    sorted by length, the global batches' order drawn, each dealt to the processes in turn. The
    order depends on the process count only through the padding (data.batch_size is global)."""

    def __init__(
        self,
        dataset: Dataset,
        num_replicas: int,
        rank: int,
        seed: int,
        lengths: Sequence[int],
        batch_size: int,
        pool_batches: int = 32,
        passes: int = 1,
    ):
        super().__init__(dataset, num_replicas, rank, seed, passes)
        self.lengths = torch.as_tensor(lengths)
        self.batch_size = batch_size
        self.pool_batches = pool_batches

    def shuffled(self, generator: torch.Generator) -> list[int]:
        # The epoch's draw, bucketed; `epoch_order` then pads it to an even share per process.
        order = torch.tensor(super().shuffled(generator))
        global_batch = self.batch_size * self.num_replicas
        pools = torch.split(order, global_batch * self.pool_batches)
        by_length = torch.cat([pool[self.lengths[pool].argsort(stable=True)] for pool in pools])
        batches = torch.split(by_length, global_batch)
        # A last, short global batch stays last: each process's batches keep their boundaries.
        full = len(order) // global_batch
        drawn = [batches[i] for i in torch.randperm(full, generator=generator).tolist()]
        return torch.cat([*drawn, *batches[full:]]).tolist()


def standardised(steps: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Steps `(T, F)` standardised per feature; a missing value (NaN) becomes the mean: 0."""
    return ((steps - mean) / std).nan_to_num(0.0)


@dataclass(eq=False, repr=False)
class Sequences(Dataset):
    """Sequences `(T_i, F)` as the table holds them and their class indices, served standardised
    with `mean` and `std` (`(F,)`), as served, not once: a checkpoint's statistics, loaded after
    `setup`, apply. `ids` name the rows kindling.predict writes."""

    sequences: list[torch.Tensor]
    labels: torch.Tensor
    mean: torch.Tensor
    std: torch.Tensor
    ids: list | None = None

    def identify(self, digest: Any) -> None:  # kindling.data.fingerprint
        from kindling.data.fingerprint import tensor_bytes

        digest.update(repr(self.ids).encode())
        digest.update(tensor_bytes(self.labels))
        for sequence in self.sequences:
            digest.update(tensor_bytes(sequence))

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return standardised(self.sequences[index], self.mean, self.std), self.labels[index]

    @staticmethod
    def collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> tuple[torch.Tensor, ...]:
        """Steps `(B, T, F)`, zero-padded after each sequence's end; lengths `(B,)`; labels."""
        steps, labels = zip(*samples, strict=True)
        lengths = torch.tensor([len(sequence) for sequence in steps])
        return pad_sequence(steps, batch_first=True), lengths, torch.stack(labels)


def collate_to_predict(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """A padded batch of sequences whose labels are their rows, laid out as new inputs are:
    `[steps, lengths, rows, readable]`."""
    return [*Sequences.collate(samples), torch.ones(len(samples), dtype=torch.bool)]


def table_to_predict(
    path: str,
    reading: Mapping[str, Any],
    features: list[str],
    mean: torch.Tensor,
    std: torch.Tensor,
) -> tuple[Sequences, list[str]]:
    """The sequences of the table `python -m kindling.predict input=<table>` names and their ids,
    read as the training table was (`reading`: its TABLE_READING keys)."""
    table = read_sequence_table(path, reading, trained=features)
    dataset = Sequences(table.sequences, table.labels, mean, std)
    dataset.collate = collate_to_predict
    return dataset, [str(name) for name in table.ids]


class SequenceTableDataModule(SplitDataModule):
    """Sequences of different lengths from one table in the long layout (tsfresh, sktime),
    which `read_sequence_table` reads. Its arguments are configs/data/sequences.yaml's keys."""

    fixed_batch_shapes = False  # each batch is padded to its longest sequence
    classes: list[str] | None = None
    features: list[str] | None = None
    mean: torch.Tensor | None = None  # (F,) of the training split's steps
    std: torch.Tensor | None = None

    def __init__(
        self,
        path: str,
        num_features: int | None = None,
        num_classes: int | None = None,
        max_length: int | None = None,
        id_column: str = "id",
        label_column: str = "label",
        time_column: str | None = "time",
        split_column: str | None = "split",
        missing: Literal["refuse", "mean"] = "refuse",
        batch_size: int = 64,
        val_fraction: float = 0.1,
        test_fraction: float = 0.2,
        seed: int = 0,
        folds: int | None = None,
        fold: int | None = None,
        num_workers: int | None = 0,
        pin_memory: bool = True,
        persistent_workers: bool = True,
        shuffle_seed: int | None = None,
        bucket: bool = False,
        min_epoch_size: int = 0,
    ):
        super().__init__()
        self.save_hyperparameters()
        if not 0.0 < test_fraction < 1.0:
            raise UserError(f"data.test_fraction must be between 0 and 1, got {test_fraction}.")

    def inputs_to_predict(self, path: str) -> tuple[Sequences, list[str]]:
        return table_to_predict(path, self.hparams, self.features, self.mean, self.std)

    def setup_splits(self) -> None:
        hp, table = self.hparams, self.table
        given = {s: torch.tensor([i for i, x in enumerate(table.splits) if x == s]) for s in SPLITS}
        train, val, test = given.values()
        if len(train) == 0:
            raise UserError(f"data.path={hp.path}: no sequence has split 'train'.")
        if len(val) and hp.folds is not None:
            raise UserError(
                f"data.folds={hp.folds}: data.path={hp.path} has a val split of its own. Leave "
                "out data.folds and data.fold, or mark those sequences train to cross-validate."
            )
        if not len(test):
            rest, test = split_off(table.labels[train], hp.test_fraction, hp.seed, stratify=True)
            train, test = train[rest], train[test]
        if not len(val):  # none given (always so with data.folds): carved from train
            rest, val = split_off(table.labels[train], hp.val_fraction, hp.seed + 1, folds=hp.folds,
                                  fold=hp.fold, stratify=True)  # fmt: skip
            train, val = train[rest], train[val]
        splits = {"train": train, "val": val, "test": test}

        trained = set(table.labels[train].tolist())
        for name in ("val", "test"):
            unseen = sorted(set(table.labels[splits[name]].tolist()) - trained)
            if unseen:
                raise UserError(
                    f"data.path={hp.path}: class {table.classes[unseen[0]]!r} is in the {name} "
                    "split but not in train. Give train sequences of it, or remove it."
                )
        if self.classes is not None and table.classes != self.classes:
            raise UserError(
                f"data.path={hp.path} has the classes {', '.join(table.classes)}, but the "
                f"checkpoint was trained on {', '.join(self.classes)}."
            )
        for name, value in self.describe().items():
            expected = hp[name]
            if expected is not None and (expected < value if name == "max_length" else
                                         expected != value):  # fmt: skip
                what = f"a sequence of {value} steps" if name == "max_length" else value
                raise UserError(
                    f"data.{name}={expected} but data.path={hp.path} has {what}. Leave "
                    f"data.{name} out: it is read from the table."
                )

        if self.mean is None:  # a checkpoint's statistics win over the table's
            # Statistics of the training split only: nothing from validation or test leaks in.
            train_steps = torch.cat([table.sequences[i] for i in train.tolist()])
            self.mean = train_steps.nanmean(dim=0)
            centred = (train_steps - self.mean).nan_to_num(0.0)
            count = (~train_steps.isnan()).sum(dim=0).clamp_min(2)
            self.std = (centred.square().sum(dim=0) / (count - 1)).sqrt().clamp_min(1e-6)
        self.classes, self.features = table.classes, table.features
        for name, indices in splits.items():
            rows = indices.tolist()
            sequences, ids = [table.sequences[i] for i in rows], [table.ids[i] for i in rows]
            split = Sequences(sequences, table.labels[indices], self.mean, self.std, ids)
            setattr(self, f"data_{name}", split)
        lengths = [len(s) for s in table.sequences]
        counts = ", ".join(f"{name} {len(indices)}" for name, indices in splits.items())
        log.info(
            "%s: %d classes, %d features, lengths %d-%d; sequences: %s.",
            hp.path, len(table.classes), len(table.features), min(lengths), max(lengths), counts,
        )  # fmt: skip

    @functools.cached_property
    def table(self) -> SequenceTable:
        return read_sequence_table(self.hparams.path, self.hparams)

    def describe(self) -> dict[str, int]:
        return {
            "num_classes": len(self.table.classes),
            "num_features": len(self.table.features),
            "max_length": max(len(sequence) for sequence in self.table.sequences),
        }

    def training_sampler(
        self, dataset: Dataset, world_size: int, rank: int, seed: int
    ) -> ResumableDistributedSampler:
        if not self.hparams.bucket:
            return super().training_sampler(dataset, world_size, rank, seed)
        lengths = [len(sequence) for sequence in dataset.sequences]
        batch_size, passes = self.batch_size_per_device, self.epoch_passes(dataset)
        return LengthBucketSampler(dataset, world_size, rank, seed, lengths, batch_size, 32, passes)

    def state_dict(self) -> dict[str, Any]:
        return {
            "mean": self.mean, "std": self.std, "classes": self.classes, "features": self.features
        }  # fmt: skip

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        # Lightning loads a checkpoint's state after `setup`: the splits serve its statistics.
        self.mean, self.std = state_dict["mean"], state_dict["std"]
        self.classes, self.features = state_dict["classes"], state_dict["features"]
        for split in (self.data_train, self.data_val, self.data_test):
            if split is not None:
                split.mean, split.std = self.mean, self.std
