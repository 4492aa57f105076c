"""Your own sequences: a long table (one row per time step, CSV or Parquet) read and checked."""

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kindling.config.errors import UserError

SPLITS = ("train", "val", "test")
# The data config keys that say how a table is read: the columns' names (`Columns.of`) and
# what a missing value does.
TABLE_READING = ("id_column", "label_column", "time_column", "split_column", "missing")


@dataclass(frozen=True)
class Columns:
    """The names of the table's special columns; every other column is a numeric feature."""

    id: str = "id"
    label: str = "label"
    time: str | None = "time"  # optional: rows keep their file order without it
    split: str | None = "split"  # optional: val and test are carved without it

    @classmethod
    def of(cls, config: Any) -> "Columns":
        """The names a data config (or a mapping with its keys) gives: `data.id_column`, ..."""
        return cls(*(config[f"{name}_column"] for name in ("id", "label", "time", "split")))


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
    columns: Columns,
    missing: str,
    *,
    to_predict: bool = False,
    option: str = "data.path",
) -> SequenceTable:
    """Group the rows into sequences (ordered by `columns.time` if present) and check them.

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
    row_ids = _column(table, columns.id, where, fix("id_column"))
    label_column = columns.label if columns.label in table.column_names else None
    if not to_predict:
        labels = _column(table, columns.label, where, fix("label_column"))
    time_column = columns.time if columns.time in table.column_names else None
    split_column = columns.split if columns.split in table.column_names else None
    special = {columns.id, label_column, time_column, split_column} - {None}
    features = [name for name in table.column_names if name not in special]
    if not features:
        raise UserError(f"{where} has no feature columns, only {', '.join(special)}.")
    values = _feature_matrix(table, features, where)

    try:
        ids, group = np.unique(row_ids, return_inverse=True)
    except TypeError:  # ids of mixed kinds (numbers and text) do not sort
        ids, group = np.unique(row_ids.astype(str), return_inverse=True)
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
    if missing == "refuse" and np.isnan(values).any():
        row, col = np.argwhere(np.isnan(values))[0]
        remedy = (
            "the checkpoint was trained with data.missing=refuse" if to_predict
            else "set data.missing=mean to fill missing values with the training mean"
        )  # fmt: skip
        raise UserError(
            f"{where}: column {features[col]!r} row {row + 1} is empty or NaN. Fill it, or "
            f"{remedy}."
        )
    first_rows = np.full(len(ids), len(group))
    np.minimum.at(first_rows, group, np.arange(len(group)))
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
