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
    """The table's sequences, ordered by id: features `(T_i, F)` (NaN where a value is missing),
    class indices into `classes`, and each sequence's split (None: to be carved). A table to
    predict has no classes: its labels are 0 and its splits None. `first_rows`: the file row
    where each sequence first appears."""

    ids: list[Any]
    sequences: list[torch.Tensor]
    labels: torch.Tensor
    classes: list[str]
    splits: list[str | None]
    features: list[str]
    first_rows: list[int]


def read_arrow(path: str | Path, option: str = "data.path") -> Any:
    """The file as a pyarrow Table: `.parquet` / `.pq` as Parquet, anything else as CSV.
    `option`: the argument that named the file, for the messages."""
    import pyarrow  # only where tables are read

    path = Path(path)
    if not path.is_file():
        raise UserError(f"{option}={path}: no such file. Give a CSV or Parquet table.")
    try:
        if path.suffix.lower() in (".parquet", ".pq"):
            import pyarrow.parquet

            return pyarrow.parquet.read_table(path)
        import pyarrow.csv

        return pyarrow.csv.read_csv(path)
    except pyarrow.ArrowInvalid as error:
        if "Empty CSV file" in str(error):
            raise UserError(f"{option}={path} is empty: it has no header and no rows.") from None
        raise UserError(f"{option}={path} cannot be read as a table: {error}") from None


def _column(table: Any, name: str, where: str, fix: str) -> np.ndarray:
    if name not in table.column_names:
        raise UserError(
            f"{where} has no column {name!r} (columns: {', '.join(table.column_names)}). {fix}"
        )
    values = np.asarray(table.column(name).to_pylist(), dtype=object)
    missing = np.flatnonzero([v is None for v in values])
    if len(missing):
        raise UserError(f"{where}: row {missing[0] + 1} has no {name!r} value. Give every row one.")
    return values


def _feature_matrix(table: Any, features: list[str], where: str) -> np.ndarray:
    """`(rows, F)` float64; missing values are NaN; a non-numeric value is refused."""
    import pyarrow

    matrix = np.empty((table.num_rows, len(features)))
    for j, name in enumerate(features):
        column = table.column(name)
        if pyarrow.types.is_integer(column.type) or pyarrow.types.is_floating(column.type):
            matrix[:, j] = column.to_numpy(zero_copy_only=False)
            continue
        for i, value in enumerate(column.to_pylist()):
            try:
                matrix[i, j] = np.nan if value is None else float(value)
            except (TypeError, ValueError):
                raise UserError(
                    f"{where}: column {name!r} row {i + 1} holds {value!r}, not a "
                    f"number. Every column but the id, time, label and split columns is a "
                    "feature: fix the value, or drop the column."
                ) from None
    return matrix


def _class_names(labels: np.ndarray) -> list[Any]:
    """Sorted: numerically for integer labels, else as text."""
    unique = set(labels.tolist())
    if all(isinstance(v, int | np.integer) for v in unique):
        return sorted(unique)
    return sorted(unique, key=str)


def _one_per_sequence(
    values: np.ndarray, group: np.ndarray, starts: np.ndarray, ids: np.ndarray, what: str, where
) -> np.ndarray:
    """Each sequence's value of a per-row column; refuses a sequence whose rows disagree."""
    first = values[starts][group]
    disagree = np.flatnonzero(first != values)
    if len(disagree):
        row = disagree[0]
        first_row = np.flatnonzero(group == group[row])[0]
        raise UserError(
            f"{where}: sequence {ids[group[row]]!r} has rows with {what}s "
            f"{values[first_row]!r} and {values[row]!r} (rows {first_row + 1} and {row + 1}). "
            f"Give each sequence one {what}."
        )
    return values[starts]


def read_sequence_table(
    path: str | Path,
    reading: Mapping[str, Any],
    *,
    to_predict: bool = False,
    option: str = "data.path",
) -> SequenceTable:
    """Group the rows into sequences (ordered by the time column if present) and check them.
    `reading`: the TABLE_READING keys' values.

    `to_predict`: a table to predict with a checkpoint's column names, whose label and split
    columns are optional and ignored. `option`: the argument that named the file (messages).
    """
    path = Path(path)
    where = f"{option}={path}"

    def fix(key: str) -> str:
        if to_predict:
            return "Add it: the checkpoint was trained on a table with it."
        return f"Add it, or name the column with data.{key}=<column>."

    table = read_arrow(path, option)
    if table.num_rows == 0:
        raise UserError(f"{where} has no rows. Give one row per time step.")
    row_ids = _column(table, reading["id_column"], where, fix("id_column"))
    if not to_predict:
        labels = _column(table, reading["label_column"], where, fix("label_column"))
    label_column, time_column, split_column = (
        name if name in table.column_names else None
        for name in (reading["label_column"], reading["time_column"], reading["split_column"])
    )
    special = {reading["id_column"], label_column, time_column, split_column} - {None}
    features = [name for name in table.column_names if name not in special]
    if not features:
        raise UserError(f"{where} has no feature columns, only {', '.join(special)}.")
    values = _feature_matrix(table, features, where)

    try:  # and the file row where each sequence first appears
        ids, first_rows, group = np.unique(row_ids, return_index=True, return_inverse=True)
    except TypeError:  # ids of mixed kinds (numbers and text) do not sort
        ids, first_rows, group = np.unique(
            row_ids.astype(str), return_index=True, return_inverse=True
        )
    order_within = np.arange(len(group))
    if time_column is not None:
        order_within = _column(table, time_column, where, fix("time_column")).astype(float)
    order = np.lexsort((order_within, group))  # by sequence, then by time (or file row)
    counts = np.bincount(group, minlength=len(ids))
    starts = np.searchsorted(group[order], np.arange(len(ids)))

    empty_rows = np.isnan(values).all(axis=1)
    empty = np.flatnonzero(np.bincount(group, weights=empty_rows, minlength=len(ids)) == counts)
    if len(empty):
        rows = np.flatnonzero(group == empty[0]) + 1
        raise UserError(
            f"{where}: sequence {ids[empty[0]]!r} is empty (rows {rows.tolist()[:5]} "
            "have no feature values). Give it its values, or remove its rows."
        )
    if reading["missing"] == "refuse" and np.isnan(values).any():
        row, col = np.argwhere(np.isnan(values))[0]
        remedy = (
            "the checkpoint was trained with data.missing=refuse" if to_predict
            else "set data.missing=mean to fill missing values with the training mean"
        )  # fmt: skip
        raise UserError(
            f"{where}: column {features[col]!r} row {row + 1} is empty or NaN. Fill it, or "
            f"{remedy}."
        )
    steps = torch.from_numpy(values[order].astype(np.float32))
    sequences = list(torch.split(steps, counts.tolist()))
    if to_predict:
        return SequenceTable(
            ids=ids.tolist(), sequences=sequences, labels=torch.zeros(len(ids), dtype=torch.long),
            classes=[], splits=[None] * len(ids), features=features,
            first_rows=first_rows.tolist(),
        )  # fmt: skip

    sorted_group = group[order]
    label_per_seq = _one_per_sequence(labels[order], sorted_group, starts, ids, "label", where)
    classes = _class_names(label_per_seq)
    index = {name: i for i, name in enumerate(classes)}
    splits: list[str | None] = [None] * len(ids)
    if split_column is not None:
        split_rows = _column(table, split_column, where, fix("split_column"))
        unknown = sorted(set(split_rows.tolist()) - set(SPLITS))
        if unknown:
            raise UserError(
                f"{where}: column {split_column!r} holds {unknown[0]!r}; "
                "its values are train, val or test."
            )
        splits = _one_per_sequence(
            split_rows[order], sorted_group, starts, ids, "split", where
        ).tolist()
    return SequenceTable(
        ids=ids.tolist(),
        sequences=sequences,
        labels=torch.tensor([index[label] for label in label_per_seq.tolist()]),
        classes=[str(name) for name in classes],
        splits=splits,
        features=features,
        first_rows=first_rows.tolist(),
    )


class LengthBucketSampler(ResumableDistributedSampler):
    """`ResumableDistributedSampler`'s epochs (every sample as often, seeded, this process's share,
    resumable mid-epoch), served in batches of similar lengths.

    Each epoch: a seeded permutation of the whole set (padded to an even share per process, as
    DistributedSampler does) is cut into pools of `pool_batches` global batches; a pool is sorted
    by length and cut into global batches, whose order is shuffled; each global batch is dealt
    to the processes in turn, so every process gets `batch_size` samples of about one length per
    step. The DataLoader's batches (of `batch_size`) are these, one after another.

    The order depends on the number of processes only through the padding (data.batch_size is
    global): a run resumed on another number serves exactly the rest of the epoch when the set
    divides evenly by both.
    """

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

    def epoch_order(self) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.tensor(self.shuffled(generator))
        order = torch.cat([order, order[: self.total_size - len(order)]])  # an even share each
        global_batch = self.batch_size * self.num_replicas
        pool = global_batch * self.pool_batches
        batches = []
        for start in range(0, len(order), pool):
            members = order[start : start + pool]
            by_length = members[torch.sort(self.lengths[members], stable=True).indices]
            batches += list(torch.split(by_length, global_batch))
        # A last, short global batch stays last: each process's batches keep their boundaries.
        full = [b for b in batches if len(b) == global_batch]
        short = [b for b in batches if len(b) < global_batch]
        shuffled = [full[i] for i in torch.randperm(len(full), generator=generator).tolist()]
        # Dealt one each in turn, each global batch (a multiple of the processes) gives every
        # process `batch_size` of its samples.
        return [index for batch in (*shuffled, *short) for index in batch.tolist()]


# A batch: steps `(B, T, F)` zero-padded after each sequence's end, lengths `(B,)`, labels `(B,)`.
SequenceBatch = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def standardised(steps: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """Steps `(T, F)` standardised per feature; a missing value (NaN) becomes the mean: 0."""
    return ((steps - mean) / std).nan_to_num(0.0)


class Sequences(Dataset):
    """Sequences `(T_i, F)` as the table holds them and their class indices, served standardised
    with `mean` and `std` (`(F,)`), as served, not once: a checkpoint's statistics, loaded after
    `setup`, apply. `collate` pads a batch; `ids` name the rows kindling.predict writes."""

    def __init__(
        self,
        sequences: list[torch.Tensor],
        labels: torch.Tensor,
        mean: torch.Tensor,
        std: torch.Tensor,
        ids: list | None = None,
    ):
        self.sequences, self.labels = sequences, labels
        self.mean, self.std, self.ids = mean, std, ids

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        return standardised(self.sequences[index], self.mean, self.std), self.labels[index]

    @staticmethod
    def collate(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> SequenceBatch:
        steps = [sequence for sequence, _ in samples]
        lengths = torch.tensor([len(sequence) for sequence in steps], dtype=torch.long)
        labels = torch.stack([label for _, label in samples])
        return pad_sequence(steps, batch_first=True), lengths, labels


def collate_to_predict(samples: list[tuple[torch.Tensor, torch.Tensor]]) -> list[torch.Tensor]:
    """A padded batch of sequences whose labels are their rows, laid out as new inputs are:
    `[steps, lengths, rows, readable]`."""
    steps, lengths, rows = Sequences.collate(samples)
    return [steps, lengths, rows, torch.ones(len(rows), dtype=torch.bool)]


def table_to_predict(
    path: str,
    reading: Mapping[str, Any],
    features: list[str],
    mean: torch.Tensor,
    std: torch.Tensor,
) -> tuple[Sequences, list[str]]:
    """The sequences of the table `python -m kindling.predict input=<table>` names, in the order
    their ids first appear, and their ids: read as the training table was (`reading`: its
    TABLE_READING keys), features in the training order."""
    table = read_sequence_table(path, reading, to_predict=True, option="input")
    check_features(table.features, features, path)
    take = [table.features.index(name) for name in features]
    order = sorted(range(len(table.ids)), key=table.first_rows.__getitem__)
    sequences = [table.sequences[i][:, take] for i in order]
    dataset = Sequences(sequences, torch.arange(len(order)), mean, std)  # labels: the rows
    dataset.collate = collate_to_predict
    return dataset, [str(table.ids[i]) for i in order]


def check_features(found: list[str], trained: list[str], path: str) -> None:
    for name in trained:
        if name not in found:
            raise UserError(
                f"input={path} has no feature column {name!r}, which the checkpoint was trained "
                f"on (features: {', '.join(trained)}). Add it."
            )
    for name in found:
        if name not in trained:
            raise UserError(
                f"input={path} has a column {name!r} that is not a feature the checkpoint was "
                f"trained on (features: {', '.join(trained)}), nor its id, label, time or split "
                "column. Drop it."
            )


class SequenceTableDataModule(SplitDataModule):
    """Sequences of different lengths from one table in the long layout (tsfresh, sktime):
    `read_sequence_table` reads it. Absent val and test splits are carved from train
    (stratified, seeded). Each feature is standardised with the mean and standard deviation of
    the training split's time steps; they are stored in checkpoints with the class names. Its
    arguments are configs/data/sequences.yaml's keys, explained there.
    """

    fixed_batch_shapes = False  # each batch is padded to its longest sequence

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
        self.classes: list[str] | None = None
        self.features: list[str] | None = None
        self.mean: torch.Tensor | None = None  # (F,) of the training split's steps
        self.std: torch.Tensor | None = None

    def inputs_to_predict(self, path: str) -> tuple[Sequences, list[str]]:
        return table_to_predict(path, self.hparams, self.features, self.mean, self.std)

    def setup_splits(self) -> None:
        hp, table = self.hparams, self.table
        splits = self._splits(table)
        self._check_counts(table, splits)
        train_steps = torch.cat([table.sequences[i] for i in splits["train"].tolist()])
        if self.mean is None:  # a checkpoint's statistics win over the table's
            # Statistics of the training split only: nothing from validation or test leaks in.
            self.mean = train_steps.nanmean(dim=0)
            centred = (train_steps - self.mean).nan_to_num(0.0)
            count = (~train_steps.isnan()).sum(dim=0).clamp_min(2)
            self.std = (centred.square().sum(dim=0) / (count - 1)).sqrt().clamp_min(1e-6)
        self.classes, self.features = table.classes, table.features
        datasets = {
            name: Sequences(
                [table.sequences[i] for i in indices.tolist()],
                table.labels[indices],
                self.mean,
                self.std,
                [table.ids[i] for i in indices.tolist()],
            )
            for name, indices in splits.items()
        }
        self.data_train, self.data_val, self.data_test = (datasets[s] for s in splits)
        lengths = [len(s) for s in table.sequences]
        counts = ", ".join(f"{name} {len(indices)}" for name, indices in splits.items())
        log.info(
            "%s: %d classes, %d features, lengths %d-%d; sequences: %s.",
            hp.path, len(table.classes), len(table.features), min(lengths), max(lengths), counts,
        )  # fmt: skip

    def _splits(self, table: SequenceTable) -> dict[str, torch.Tensor]:
        hp = self.hparams
        given = {s: torch.tensor([i for i, x in enumerate(table.splits) if x == s]) for s in SPLITS}
        if all(split is None for split in table.splits):
            given["train"] = torch.arange(len(table.splits))
        if len(given["train"]) == 0:
            raise UserError(f"data.path={hp.path}: no sequence has split 'train'.")
        if len(given["val"]) and hp.folds is not None:
            raise UserError(
                f"data.folds={hp.folds}: data.path={hp.path} has a val split of its own. Leave "
                "out data.folds and data.fold, or mark those sequences train to cross-validate."
            )
        train, labels = given["train"], table.labels
        if not len(given["test"]):
            rest, test = split_off(labels[train], hp.test_fraction, hp.seed, stratify=True)
            train, given["test"] = train[rest], train[test]
        if hp.folds is not None or not len(given["val"]):
            rest, val = split_off(labels[train], hp.val_fraction, hp.seed + 1, folds=hp.folds,
                                  fold=hp.fold, stratify=True)  # fmt: skip
            train, given["val"] = train[rest], train[val]
        return {"train": train, "val": given["val"], "test": given["test"]}

    def _check_counts(self, table: SequenceTable, splits: dict[str, torch.Tensor]) -> None:
        hp = self.hparams
        trained = set(table.labels[splits["train"]].tolist())
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
        batch_size = self.batch_size_per_device
        passes = self.epoch_passes(dataset)
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
