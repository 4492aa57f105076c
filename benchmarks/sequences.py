"""JapaneseVowels (UCI; 9 speakers, 12 LPC coefficients a step) as a long table for
`data=sequences`, from the `.ts` files bundled in aeon's wheel (no download).

    pip install aeon   # the `bench` extra: not what training needs
    python benchmarks/japanese_vowels.py --out data/japanese_vowels.csv

Writes one row per time step: `id`, `time`, `label` (the speaker, 1-9), `split` (the archive's
270 train and 370 test utterances) and the coefficients `c1`..`c12`. Then, with `--seeds`,

    python benchmarks/japanese_vowels.py --table data/japanese_vowels.csv --seeds 0 1 2 \
        -- model=lstm model.net.bidirectional=true trainer.max_epochs=30

runs `python train.py data=sequences data.path=<table> <overrides> seed=<seed>` once per seed
(in kindling's environment; the table needs no aeon) and prints each test/acc and the median.
And the field's baselines on the table's split, in aeon's environment:

    python benchmarks/japanese_vowels.py --table data/japanese_vowels.csv --baselines

MiniRocket (aeon's `MiniRocketClassifier`, seed 0; it takes equal lengths, so each series is
padded by repeating its last step) and 1-NN DTW (`KNeighborsTimeSeriesClassifier`, full
window), trained on all 270 train sequences (kindling holds a tenth out for validation).
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


def baselines(table: Path) -> None:
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
    for name, (model, shape) in models.items():
        model.fit(shape(train), np.array(train_labels))
        accuracy = float(np.mean(model.predict(shape(test)) == np.array(test_labels)))
        print(f"{name}: test accuracy {accuracy:.4f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("data/japanese_vowels.csv"))
    parser.add_argument("--table", type=Path, help="train on this table (written before)")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--baselines", action="store_true", help="MiniRocket and 1-NN DTW")
    parser.add_argument("overrides", nargs="*", help="python train.py overrides, after --")
    args = parser.parse_args()
    if args.baselines:
        baselines(args.table)
        return
    if args.table is not None:
        accuracies = test_accuracies(args.table.resolve(), args.seeds, args.overrides)
        print(f"{' '.join(args.overrides)}: median test/acc {statistics.median(accuracies):.4f}")
        return
    write_table(args.out)


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
