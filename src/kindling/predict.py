"""Predict classes for a folder of images (or a data set split) from a checkpoint alone.

    python -m kindling.predict ckpt_path=<file> input=<folder of images> output=predictions.csv

`input=test` (or `val`) predicts that split of the data set the model was trained on instead.
The CSV has one row per image: file (or index), class, probability. The checkpoint holds the
model's config, its weights and the training set's per-channel statistics, so nothing else is
needed. The Lightning Trainer places the work (`accelerator=auto`: a GPU when there is one).
"""

import csv
import logging
import sys
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import torch
from hydra.utils import instantiate
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException
from torch.utils.data import DataLoader, Dataset
from torchvision.io import ImageReadMode, decode_image
from torchvision.transforms.v2.functional import resize

from kindling.utils.checkpoint import load_module
from kindling.utils.errors import UserError

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".webp"}


@dataclass
class PredictArgs:
    ckpt_path: str = "???"  # a checkpoint written by train.py
    input: str = "???"  # a folder of image files, or a split: test | val
    output: str = "predictions.csv"
    batch_size: int = 256
    accelerator: str = "auto"  # cpu | gpu | auto


USAGE = "python -m kindling.predict ckpt_path=<file> input=<folder | test | val> output=<csv>"


class ImageFiles(Dataset):
    """Image files read as the model's input: resized to (H, W), C channels, standardised with
    the training set's per-channel `mean` and `std`."""

    def __init__(
        self, files: list[Path], image_shape: list[int], mean: torch.Tensor, std: torch.Tensor
    ):
        self.files = files
        self.channels, self.height, self.width = image_shape
        self.mode = ImageReadMode.GRAY if self.channels == 1 else ImageReadMode.RGB
        # Statistics are stored as (1, C, 1, 1); one image is (C, H, W).
        self.mean, self.std = mean[0], std[0]

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int) -> torch.Tensor:
        image = decode_image(str(self.files[index]), mode=self.mode)
        image = resize(image, [self.height, self.width], antialias=True)
        return (image.float() / 255.0 - self.mean) / self.std


def image_files(folder: Path) -> list[Path]:
    if not folder.is_dir():
        raise UserError(f"input={folder} is not a folder. Give a folder of images, or test / val.")
    files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
    if not files:
        suffixes = ", ".join(sorted(IMAGE_SUFFIXES))
        raise UserError(f"No image files ({suffixes}) in {folder}.")
    return files


def predict(args: PredictArgs) -> Path:
    """Write the predictions CSV; return its path."""
    module, checkpoint = load_module(args.ckpt_path)
    data_cfg = checkpoint["config"]["data"]
    if args.input in ("test", "val"):
        datamodule = instantiate(data_cfg, batch_size=args.batch_size)
        datamodule.setup("predict")
        loader = getattr(datamodule, f"{args.input}_dataloader")()
        names = [str(i) for i in range(len(loader.dataset))]
    else:
        files = image_files(Path(args.input))
        stats = checkpoint.get(data_cfg["_target_"].rsplit(".", 1)[-1], {})
        if stats.get("mean") is None:
            raise UserError(f"{args.ckpt_path} has no image statistics: retrain with this version.")
        dataset = ImageFiles(files, data_cfg["image_shape"], stats["mean"], stats["std"])
        loader = DataLoader(dataset, batch_size=args.batch_size)
        names = [str(f) for f in files]

    trainer = L.Trainer(
        accelerator=args.accelerator, devices=1, logger=False, enable_progress_bar=False
    )
    probabilities = torch.cat(trainer.predict(module, dataloaders=loader))
    confidence, classes = probabilities.max(dim=1)

    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    with open(output, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["file", "class", "probability"])
        for name, label, p in zip(names, classes.tolist(), confidence.tolist(), strict=True):
            writer.writerow([name, label, f"{p:.6f}"])
    return output


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        try:
            args = OmegaConf.merge(OmegaConf.structured(PredictArgs), OmegaConf.from_cli(argv))
            args = PredictArgs(**OmegaConf.to_container(args, throw_on_missing=True))
        except OmegaConfBaseException as error:
            raise UserError(f"{error.msg}. Usage: {USAGE}") from error
        output = predict(args)
    except UserError as error:
        logging.getLogger("kindling").error("%s", error)
        sys.exit(1)
    logging.getLogger("kindling").info("Predictions: %s", output)


if __name__ == "__main__":
    main(sys.argv[1:])
