"""Predict classes for a folder of images, a table of sequences (or a data set split) from a
checkpoint alone (docs/resume.md, *Predict*).

    python -m kindling.predict ckpt_path=<file> input=<folder | table | test | val> [devices=N]

One CSV row per image (`file,class,probability`, in the folder's sorted order) or per sequence
(`id,class,probability`, in the order the ids first appear), written to `output=` or to the
checkpoint's run folder. The checkpoint's data config builds
the data module, whose `predict_dataloader` serves `input` (kindling.data.loaders.SplitDataModule)
as training read its data, with the checkpoint's statistics; `trainer.predict` places the work.
"""

import logging
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from hydra.utils import instantiate
from lightning.pytorch.callbacks import BasePredictionWriter

from kindling import cli
from kindling.data.loaders import PREDICT_SPLITS
from kindling.errors import UserError
from kindling.files import is_url, probe_writable
from kindling.hardware import best_precision
from kindling.loading import data_state, load_module

log = logging.getLogger("kindling")


@dataclass
class PredictArgs:
    ckpt_path: str  # a checkpoint written by train.py
    input: str  # a folder of image files, a table of sequences, or a split: test | val
    # The CSV to write; null: predictions.csv in the checkpoint's run folder (here, for a
    # checkpoint outside one), so that a clone stays clean.
    output: str | None = None
    overwrite: bool = False  # replace an output file that is not a CSV of predictions
    batch_size: int = 256
    num_workers: int | None = None  # loader processes; null: the data config's
    accelerator: str = "auto"  # cpu | gpu | auto
    devices: int = 1  # processes (one per device) sharing the files or sequences


USAGE = (
    "python -m kindling.predict ckpt_path=<file> input=<folder | table | test | val> "
    "[output=<csv>] [devices=N] [overwrite=true]"
)
# The first line of the CSV predict writes, for images and for sequences.
CSV_HEADERS = (b"file,class,probability", b"id,class,probability")


class CollectRows(BasePredictionWriter):
    """Keep `(row, class, probability)` of each readable input and the rows of the unreadable
    ones: a batch ends with `(rows, readable)` (kindling.data.loaders), or is a split's own,
    served in order on one device. With several processes, each predicting its own share
    (Lightning's unrepeated distributed sampler), every process ends with all the rows."""

    def __init__(self) -> None:
        super().__init__(write_interval="batch")
        self.rows: list[tuple[int, int, float]] = []
        self.unreadable: list[int] = []

    def write_on_batch_end(
        self, trainer, pl_module, prediction, batch_indices, batch, batch_idx, dataloader_idx
    ) -> None:
        confidence, classes = prediction.max(dim=1)
        if batch[-1].dtype == torch.bool:  # new inputs: `[*inputs, rows, readable]`
            *_, indices, readable = batch
        else:  # a split's own batches, in order: their rows follow the last batch's
            indices = torch.arange(len(self.rows), len(self.rows) + len(classes))
            readable = torch.ones(len(classes), dtype=torch.bool)
        for i, ok, c, p in zip(indices.tolist(), readable.tolist(), classes.tolist(),
                               confidence.tolist(), strict=True):  # fmt: skip
            if ok:
                self.rows.append((i, c, p))
            else:
                self.unreadable.append(i)

    def on_predict_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.world_size > 1:  # `Trainer.predict` gathers nothing of its own
            parts: list = [None] * trainer.world_size
            torch.distributed.all_gather_object(parts, (self.rows, self.unreadable))
            self.rows = [row for rows, _ in parts for row in rows]
            self.unreadable = [index for _, unreadable in parts for index in unreadable]


def default_output(ckpt_path: str) -> str:
    """`<run>/predictions.csv` for `<run>/checkpoints/<file>.ckpt`; else `predictions.csv`."""
    checkpoint = Path(ckpt_path)
    if is_url(ckpt_path) or checkpoint.parent.name != "checkpoints":
        return "predictions.csv"
    return str(checkpoint.parent.parent / "predictions.csv")


def check_output(args: PredictArgs) -> Path:
    """Refuse, before any work, an `output=` that writing would destroy or cannot write."""
    output = Path(args.output)
    read = {"checkpoint": args.ckpt_path, "input": args.input}
    same = [
        w for w, p in read.items() if output.is_file() and Path(p).exists() and output.samefile(p)
    ]
    folder = output.absolute().parent
    while not folder.exists():  # made when the predictions are written
        folder = folder.parent
    if output.is_dir():
        refusal = f"is a folder: name the CSV file to write (output={output / 'predictions.csv'})"
    elif output.exists() and not output.is_file():  # the rename would replace a device, a pipe
        refusal = "is not a regular file (a device, a pipe or a socket): name the CSV file to write"
    elif same:
        refusal = f"is the {same[0]} it reads: write the predictions to another file"
    elif output.exists() and not args.overwrite and not _is_predictions(output):
        refusal = "exists and is not a CSV of predictions: choose another output=, or add " \
                  "overwrite=true to replace it"  # fmt: skip
    else:
        try:
            probe_writable(folder)
            return output
        except OSError:
            refusal = f"cannot be written: {folder} is not a folder you can write. Choose " \
                      "output= in one you can"  # fmt: skip
    raise UserError(f"output={args.output} {refusal}.")


def _is_predictions(path: Path) -> bool:
    with open(path, "rb") as file:
        return file.readline(100).rstrip(b"\r\n") in CSV_HEADERS


def predict(args: PredictArgs) -> Path:
    args.output = args.output or default_output(args.ckpt_path)
    output = check_output(args)
    module, checkpoint = load_module(args.ckpt_path)
    data_cfg, state = data_state(checkpoint, args.ckpt_path)
    classes = state.get("classes")
    if args.devices < 1:
        raise UserError(f"devices={args.devices}: give the number of processes, 1 or more.")
    if args.devices > 1 and args.input in PREDICT_SPLITS:
        raise UserError(f"input={args.input} is predicted on one device: set devices=1.")
    collect = CollectRows()
    trainer = L.Trainer(
        accelerator=args.accelerator, devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto", callbacks=[collect],
        precision=best_precision(args.accelerator), logger=False, enable_model_summary=False,
    )  # fmt: skip
    workers = {} if args.num_workers is None else {"num_workers": args.num_workers}
    # load_module has checked the stored data config's targets.
    datamodule = instantiate(data_cfg, _convert_="all", batch_size=args.batch_size, **workers)
    datamodule.load_state_dict(state)
    datamodule.predict_input = args.input
    trainer.predict(module, datamodule=datamodule, return_predictions=False)
    names = datamodule.predict_names
    if trainer.global_rank != 0:  # the first process writes every process's rows
        return output
    unreadable = [names[i] for i in sorted(collect.unreadable)]
    for name in unreadable:
        log.warning("Skipped %s: not a readable image (corrupt or truncated).", name)
    header = ["id" if state.get("features") is not None else "file", "class", "probability"]
    cli.write_csv(output, header, (
        [names[index], classes[label] if classes else label, f"{p:.6f}"]
        for index, label, p in sorted(collect.rows)
    ))  # fmt: skip
    if unreadable:
        log.warning("%d of %d files could not be decoded; they are not in %s.",
                    len(unreadable), len(names), output)  # fmt: skip
    log.info("Predictions: %s", output)
    return output


main = cli.command(PredictArgs, USAGE)(predict)


if __name__ == "__main__":
    main()
