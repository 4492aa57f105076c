"""Does augmentation help? Test accuracy with and without it, on a small real training set.

    python benchmarks/augment.py --val-fraction 0.8 --epochs 30 --seeds 0 1 2

Trains the default CNN on scikit-learn's 8x8 digits (real handwriting, bundled: no download)
through `kindling.train.run`, once per seed and per `augment` option, and tests the best
checkpoint on the 359 held-out test images. `--val-fraction 0.8` keeps 20% of the 1,438
training images (288) for training: the small-data regime where augmentation matters. Prints
one line per run and the mean test accuracy per option; writes `augment.json` to
`benchmarks/results/` (or `--out`).
"""

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import open_dict

ROOT = Path(__file__).resolve().parents[1]

from kindling.train import run  # noqa: E402 - registers the config resolvers


def test_accuracy(overrides: list[str], folder: Path) -> float:
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides, return_hydra_config=True)
    GlobalHydra.instance().clear()
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
        cfg.paths.output_dir = str(folder)
        cfg.paths.log_dir = str(folder / "logs")
    run(cfg)
    metrics = (folder / "csv" / "metrics.csv").read_text().splitlines()
    header, last = metrics[0].split(","), metrics[-1].split(",")
    return float(last[header.index("test/acc")])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--val-fraction", type=float, default=0.8)
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--options", nargs="+", default=["none", "crop"])
    parser.add_argument("--val-every", type=int, default=1, help="validate every N epochs")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    logging.disable(logging.WARNING)
    torch.set_num_threads(1)  # runs of a machine shared with others compare better

    accuracies: dict[str, list[float]] = {option: [] for option in args.options}
    for seed in args.seeds:
        for option in args.options:
            overrides = [
                "data=digits", f"augment={option}", f"data.val_fraction={args.val_fraction}",
                f"data.batch_size={args.batch_size}",
                f"seed={seed}", "trainer=cpu", f"trainer.max_epochs={args.epochs}",
                f"trainer.check_val_every_n_epoch={args.val_every}",
                "callbacks.early_stopping=null", "callbacks.rich_progress_bar=null",
                "callbacks.rich_model_summary=null", "callbacks.plots=null", "logger=csv",
            ]  # fmt: skip
            start = time.perf_counter()
            with tempfile.TemporaryDirectory() as folder:
                accuracy = test_accuracy(overrides, Path(folder))
            accuracies[option].append(accuracy)
            seconds = time.perf_counter() - start
            print(f"seed {seed} augment={option:<10} test/acc {accuracy:.4f} ({seconds:.0f} s)")

    train_images = round(1438 * (1 - args.val_fraction))
    print(
        f"\ndigits, {train_images} training images, batch {args.batch_size}, {args.epochs} "
        f"epochs, seeds {args.seeds}"
    )
    summary = {}
    for option, values in accuracies.items():
        mean = statistics.mean(values)
        summary[option] = {"test_acc": values, "mean": mean}
        print(f"augment={option:<10} mean test/acc {mean:.4f}  (runs: "
              + ", ".join(f"{v:.4f}" for v in values) + ")")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "results": summary}
    (args.out / "augment.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    sys.exit(main())
