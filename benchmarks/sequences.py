"""Every kindling family on JapaneseVowels beside the field's baselines, on the same split.

    pip install -e '.[bench]'   # aeon: the data set (bundled in its wheel) and the baselines
    python benchmarks/sequences.py [--seeds 0 1 2] [--models lstm gru] [-- <train.py overrides>]

Writes aeon's JapaneseVowels (UCI; 9 speakers, 12 LPC coefficients a step, 7-29 steps) as the
long table `data=sequences` reads, `data/japanese_vowels.csv` (`--table`), unless it exists:
one row per time step, `id`, `time`, `label` (the speaker, 1-9), `split` (the archive's 270
train and 370 test utterances) and the coefficients `c1`..`c12`. Then runs

    python train.py data=sequences data.path=<table> model=<family> trainer.max_epochs=30 \
        seed=<seed>

once per family and seed, kindling's defaults otherwise (a tenth of train carved for
validation, the checkpoint of best val/loss tested), and the baselines on the table's split:
MiniRocket (aeon's `MiniRocketClassifier`, seed 0; it takes equal lengths, so each series is
padded by repeating its last step) and 1-NN DTW (`KNeighborsTimeSeriesClassifier`, full
window), trained on all 270 train sequences. Prints each test accuracy, and a table of every
family's seeds and median beside the baselines.
"""

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_accuracies(table: Path, seeds: list[int], overrides: list[str]) -> list[float]:
    accuracies = []
    with tempfile.TemporaryDirectory() as folder:
        for seed in seeds:
            run_dir = Path(folder) / str(seed)
            command = [
                sys.executable, str(ROOT / "train.py"), "data=sequences", f"data.path={table}",
                *overrides, f"seed={seed}", f"paths.output_dir={run_dir}",
                "callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null",
            ]  # fmt: skip
            subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
            with open(run_dir / "csv" / "metrics.csv") as f:
                rows = list(csv.DictReader(f))
            (tested,) = [row for row in rows if row.get("test/acc")]
            accuracies.append(float(tested["test/acc"]))
            epochs = 1 + max(int(row["epoch"]) for row in rows if row.get("val/acc"))
            (checkpoint,) = (run_dir / "checkpoints").glob("epoch_*.ckpt")
            print(f"seed {seed}: test/acc {accuracies[-1]:.4f} ({epochs} epochs trained, "
                  f"tested {checkpoint.name})", flush=True)  # fmt: skip
    return accuracies


def read_split(table: Path, split: str) -> tuple[list, list]:
    """The table's sequences of `split` as `(channels, steps)` arrays, and their labels."""
    import numpy as np

    steps: dict[str, list] = {}
    labels: dict[str, str] = {}
    with open(table) as f:
        for row in csv.DictReader(f):
            if row["split"] == split:
                features = [float(row[f"c{j + 1}"]) for j in range(12)]
                steps.setdefault(row["id"], []).append((int(row["time"]), features))
                labels[row["id"]] = row["label"]
    series = [np.array([f for _, f in sorted(rows)]).T for rows in steps.values()]
    return series, [labels[i] for i in steps]


def baselines(table: Path) -> dict[str, float]:
    import numpy as np
    from aeon.classification.convolution_based import MiniRocketClassifier
    from aeon.classification.distance_based import KNeighborsTimeSeriesClassifier

    (train, train_labels), (test, test_labels) = (read_split(table, s) for s in ("train", "test"))
    longest = max(x.shape[1] for x in train + test)

    def padded(series: list) -> np.ndarray:
        return np.stack([np.pad(x, ((0, 0), (0, longest - x.shape[1])), mode="edge")
                         for x in series])  # fmt: skip

    models = {
        "MiniRocket": (MiniRocketClassifier(random_state=0), padded),
        "1-NN DTW": (KNeighborsTimeSeriesClassifier(distance="dtw"), list),
    }
    accuracies = {}
    for name, (model, shape) in models.items():
        model.fit(shape(train), np.array(train_labels))
        accuracies[name] = float(np.mean(model.predict(shape(test)) == np.array(test_labels)))
        print(f"{name}: test accuracy {accuracies[name]:.4f}", flush=True)
    return accuracies


FAMILIES = ["rnn", "lstm", "gru", "transformer", "temporal_conv"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", type=Path, default=ROOT / "data" / "japanese_vowels.csv")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--models", nargs="+", default=FAMILIES, help="kindling families")
    parser.add_argument("--epochs", type=int, default=30, help="trainer.max_epochs")
    parser.add_argument("overrides", nargs="*", help="python train.py overrides, after --")
    args = parser.parse_args()
    if not args.table.is_file():
        write_table(args.table)
    table = args.table.resolve()
    results = {}
    for family in args.models:
        overrides = [f"model={family}", f"trainer.max_epochs={args.epochs}", *args.overrides]
        print(" ".join(overrides), flush=True)
        results[family] = test_accuracies(table, args.seeds, overrides)
    print("Baselines, trained on the whole train split:", flush=True)
    reference = baselines(table)

    print(f"\nJapaneseVowels, test accuracy ({args.epochs} epochs{' ' if args.overrides else ''}"
          f"{' '.join(args.overrides)}):\n")  # fmt: skip
    print("| model | " + " | ".join(f"seed {seed}" for seed in args.seeds) + " | median |")
    print("| --- |" + " ---: |" * (len(args.seeds) + 1))
    for family, accuracies in results.items():
        cells = " | ".join(f"{a:.4f}" for a in accuracies)
        print(f"| `{family}` | {cells} | {statistics.median(accuracies):.4f} |")
    for name, accuracy in reference.items():
        print(f"| {name} |" + " |" * len(args.seeds) + f" {accuracy:.4f} |")


def write_table(out: Path) -> None:
    from aeon.datasets import load_classification  # the bench extra

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        table = csv.writer(f)
        table.writerow(["id", "time", "label", "split", *(f"c{j + 1}" for j in range(12))])
        number, lengths = 0, []
        for split in ("train", "test"):
            series, labels = load_classification(
                "JapaneseVowels", split=split, load_equal_length=False
            )
            for channels, label in zip(series, labels, strict=True):  # channels: (12, length)
                for time, step in enumerate(channels.T):
                    table.writerow([number, time, label, split, *(f"{v:.6g}" for v in step)])
                number += 1
                lengths.append(channels.shape[1])
    print(f"{out}: {number} sequences, {min(lengths)}-{max(lengths)} steps")


if __name__ == "__main__":
    main()
