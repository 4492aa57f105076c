"""Your own sequences: variable-length time series from a long table, padded per batch."""

import functools
import logging
from typing import Any, Literal

import torch
from torch.nn.utils.rnn import pad_sequence
from torch.utils.data import Dataset

from kindling.config.errors import UserError
from kindling.data.loaders import ResumableDistributedSampler, SplitDataModule
from kindling.data.sequence_table import (
    TABLE_READING,
    Columns,
    SequenceTable,
    read_sequence_table,
)
from kindling.data.splits import split_off

log = logging.getLogger(__name__)

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
    path: str, reading: dict[str, Any], features: list[str], mean: torch.Tensor, std: torch.Tensor
) -> tuple[Sequences, list[str]]:
    """The sequences of the table `python -m kindling.predict input=<table>` names, in the order
    their ids first appear, and their ids: read as the training table was (`reading`: its
    TABLE_READING keys), features in the training order."""
    columns = Columns.of(reading)
    table = read_sequence_table(path, columns, reading["missing"], to_predict=True, option="input")
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
    kindling.data.sequence_table reads it. Absent val and test splits are carved from train
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
        self.columns = Columns(id_column, label_column, time_column, split_column)
        self.classes: list[str] | None = None
        self.features: list[str] | None = None
        self.mean: torch.Tensor | None = None  # (F,) of the training split's steps
        self.std: torch.Tensor | None = None

    def inputs_to_predict(self, path: str) -> tuple[Sequences, list[str]]:
        reading = {key: self.hparams[key] for key in TABLE_READING}
        return table_to_predict(path, reading, self.features, self.mean, self.std)

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
        given = {s: torch.tensor([i for i, x in enumerate(table.splits) if x == s]) for s in
                 ("train", "val", "test")}  # fmt: skip
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
        return read_sequence_table(self.hparams.path, self.columns, self.hparams.missing)

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
        from kindling.data.buckets import LengthBucketSampler  # only when bucketing

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
