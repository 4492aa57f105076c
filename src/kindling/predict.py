"""Predict classes for a folder of images, a table of sequences (or a data set split) from a
checkpoint alone.

    python -m kindling.predict ckpt_path=<file> input=<folder of images> output=predictions.csv
    python -m kindling.predict ckpt_path=<data=sequences file> input=<table.csv|.parquet>

`input=test` (or `val`) predicts that split of the data set the model was trained on instead.
The CSV has one row per image, in the folder's (sorted) order: file (or index), class (its name
when the training data named its classes: an image folder's folder names), probability. Files
that cannot be decoded are named in a warning and left out. A table of sequences (the long
layout the model was trained on, read with the checkpoint's column names; label and split
columns are ignored) gives one row per sequence id, in the order the ids first appear:
id, class, probability; its features are standardised with the checkpoint's statistics, never
the table's own. `devices=N` predicts on N processes (DDP: N GPUs, or N CPU processes where
there is no GPU), each on its own share of the files or sequences; each writes its rows to a
part file, and the first merges them into the one CSV. The checkpoint holds the model's config,
its weights and the training set's statistics (per channel, or per feature), so nothing else is
needed: its data config builds the data module, whose `predict_dataloader` serves `input`
(kindling.data.loaders.SplitDataModule), and `trainer.predict` places the work
(`accelerator=auto`: a GPU when there is one).

`output=` is checked before any work: a folder, the checkpoint or input being read, or a place
that cannot be written is refused; so is an existing file other than an earlier CSV of
predictions, unless `overwrite=true`. The CSV is written beside it and renamed into place.
"""

import csv
import io
import json
import logging
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter
from lightning.pytorch.utilities import rank_zero_only

from kindling import cli
from kindling.config.errors import UserError
from kindling.data.loaders import PREDICT_SPLITS
from kindling.files import probe_writable, write_atomically
from kindling.garbage_collection import skip_collections_at_exit
from kindling.hardware import best_precision
from kindling.loading import data_state, instantiate_stored, load_module

log = logging.getLogger("kindling")


@dataclass
class PredictArgs:
    ckpt_path: str  # a checkpoint written by train.py
    input: str  # a folder of image files, a table of sequences, or a split: test | val
    output: str = "predictions.csv"
    overwrite: bool = False  # replace an output file that is not a CSV of predictions
    batch_size: int = 256
    num_workers: int | None = None  # loader processes; null: the data config's
    accelerator: str = "auto"  # cpu | gpu | auto
    devices: int = 1  # processes (one per device) sharing the files or sequences


USAGE = (
    "python -m kindling.predict ckpt_path=<file> input=<folder | table | test | val> "
    "output=<csv> [devices=N] [overwrite=true]"
)
# The first line of the CSV predict writes, for images and for sequences.
CSV_HEADERS = (b"file,class,probability", b"id,class,probability")


class CollectRows(BasePredictionWriter):
    """Keep `(row, class, probability)` of each readable input (an image, or a sequence), and
    the unreadable rows; a batch ends with `(rows, readable)` (kindling.data.loaders), or is a
    split's own, served in order on one device.

    With several processes each predicts its own share of the files (Lightning's unrepeated
    distributed sampler: every file once), writes its rows to `parts/rank<N>.json` at the end,
    and the first process reads every part back: its `rows` and `unreadable` are then the
    whole folder's, each file once.
    """

    def __init__(self, parts: Path):
        super().__init__(write_interval="batch")
        self.parts = parts
        self.rows: list[tuple[int, int, float]] = []
        self.unreadable: list[int] = []

    def write_on_batch_end(
        self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx
    ) -> None:
        confidence, classes = prediction.max(dim=1)
        if batch[-1].dtype == torch.bool:  # new inputs: `[*inputs, rows, readable]`
            *_, indices, readable = batch
        else:  # a split's own batches, in order: their rows follow the last batch's
            start = len(self.rows)
            indices = torch.arange(start, start + len(classes))
            readable = torch.ones(len(classes), dtype=torch.bool)
        for i, ok, c, p in zip(indices.tolist(), readable.tolist(), classes.tolist(),
                               confidence.tolist(), strict=True):  # fmt: skip
            if ok:
                self.rows.append((i, c, p))
            else:
                self.unreadable.append(i)

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.world_size == 1:
            return
        self.parts.mkdir(parents=True, exist_ok=True)
        part = {"rows": self.rows, "unreadable": self.unreadable}
        (self.parts / f"rank{trainer.global_rank}.json").write_text(json.dumps(part))
        trainer.strategy.barrier("predictions written")
        if trainer.global_rank != 0:
            return
        rows: dict[int, tuple[int, int, float]] = {}
        unreadable: set[int] = set()
        for rank in range(trainer.world_size):
            written = json.loads((self.parts / f"rank{rank}.json").read_text())
            rows.update((row[0], tuple(row)) for row in written["rows"])
            unreadable.update(written["unreadable"])
        self.rows, self.unreadable = list(rows.values()), list(unreadable)
        shutil.rmtree(self.parts)


def check_output(args: PredictArgs) -> Path:
    """Refuse, before any work, an `output=` that writing would destroy or cannot write: a
    folder, the checkpoint or input being read, another file (unless `overwrite`), a place
    that cannot be written."""
    output = Path(args.output)
    if output.is_dir():
        raise UserError(
            f"output={args.output} is a folder: name the CSV file to write "
            f"(output={output / 'predictions.csv'})."
        )
    if output.exists() and not output.is_file():  # a device, a pipe: the rename would replace it
        raise UserError(
            f"output={args.output} is not a regular file (a device, a pipe or a socket): name "
            "the CSV file to write."
        )
    for read, what in ((args.ckpt_path, "checkpoint"), (args.input, "input")):
        if output.is_file() and Path(read).exists() and output.samefile(read):
            raise UserError(
                f"output={args.output} is the {what} it reads: write the predictions to "
                "another file."
            )
    if output.is_file() and not args.overwrite and not _is_predictions(output):
        raise UserError(
            f"output={args.output} exists and is not a CSV of predictions: choose another "
            "output=, or add overwrite=true to replace it."
        )
    folder = output.absolute().parent
    while not folder.exists():  # made when the predictions are written
        folder = folder.parent
    try:
        probe_writable(folder)
    except OSError:
        raise UserError(
            f"output={args.output} cannot be written: {folder} is not a folder you can write. "
            "Choose output= in one you can."
        ) from None
    return output


def _is_predictions(path: Path) -> bool:
    with open(path, "rb") as file:
        return file.readline(100).rstrip(b"\r\n") in CSV_HEADERS


def write_predictions(output: Path, header: list[str], rows: list[list[str]]) -> None:
    """The CSV, written beside `output` and renamed into place: a failure leaves it as it was."""
    text = io.StringIO()
    writer = csv.writer(text)
    writer.writerow(header)
    writer.writerows(rows)
    write_atomically(output, lambda file: file.write(text.getvalue().encode()))


def predict(args: PredictArgs) -> Path:
    """Write the predictions CSV; return its path."""
    output = check_output(args)
    module, checkpoint = load_module(args.ckpt_path)
    data_cfg, state = data_state(checkpoint, args.ckpt_path)
    is_sequences = state.get("features") is not None
    class_names = state.get("classes")
    if args.devices < 1:
        raise UserError(f"devices={args.devices}: give the number of processes, 1 or more.")
    if args.devices > 1 and args.input in PREDICT_SPLITS:
        raise UserError(f"input={args.input} is predicted on one device: set devices=1.")
    trainer = L.Trainer(
        accelerator=args.accelerator, devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        precision=best_precision(args.accelerator), logger=False, enable_progress_bar=True,
        enable_model_summary=False,
    )  # fmt: skip
    collect = CollectRows(parts=output.parent / f".{output.name}.parts")
    trainer.callbacks.append(collect)
    overrides = {"batch_size": args.batch_size}
    if args.num_workers is not None:
        overrides["num_workers"] = args.num_workers
    datamodule = instantiate_stored(data_cfg, args.ckpt_path, **overrides)
    datamodule.load_state_dict(state)
    datamodule.predict_input = args.input
    trainer.predict(module, datamodule=datamodule, return_predictions=False)
    names = datamodule.predict_names
    if trainer.global_rank != 0:  # the first process writes the merged rows
        return output
    rows = sorted(collect.rows)
    unreadable = [names[i] for i in sorted(collect.unreadable)]
    for name in unreadable:
        log.warning("Skipped %s: not a readable image (corrupt or truncated).", name)

    header = ["id" if is_sequences else "file", "class", "probability"]
    write_predictions(output, header, [
        [names[index], class_names[label] if class_names else label, f"{p:.6f}"]
        for index, label, p in rows
    ])  # fmt: skip
    if unreadable:
        log.warning("%d of %d files could not be decoded; they are not in %s.",
                    len(unreadable), len(names), output)  # fmt: skip
    return output


@cli.main
def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    output = predict(cli.parse(PredictArgs, argv, USAGE))
    if rank_zero_only.rank == 0:  # every process writes its part; the first, the CSV
        log.info("Predictions: %s", output)


if __name__ == "__main__":
    skip_collections_at_exit()
    main(sys.argv[1:])
