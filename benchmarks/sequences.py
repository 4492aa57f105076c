"""Every kindling family on six archive sets beside the field's baselines, on the same splits.

    pip install -e '.[bench]'   # aeon: the data sets (bundled in its wheel) and the baselines
    python benchmarks/sequences.py [--sets GunPoint ACSF1] [--models lstm gru] \
        [--recipe temporal_conv --recipe-seeds 0 1 2] [-- <train.py overrides>]
    python benchmarks/sequences.py --models --recipe-seeds   # the baselines alone

Writes each of aeon's bundled UCR/UEA sets (ArrowHead, GunPoint, ItalyPowerDemand, OSULeaf,
ACSF1, JapaneseVowels: 2 to 10 classes, 36 to 270 training sequences of 7 to 1,460 steps) as
the long table `data=sequences` reads, `data/archive/<set>.csv`, unless it exists: one row per
time step, `id`, `time`, `label`, `split` (the archive's own train and test sequences) and the
channels `c1`..`cK`. Then runs

    python train.py data=sequences data.path=<table> model=<family> seed=<seed> [overrides]

once per set and family on seed 0, kindling's defaults otherwise, and the recommended recipe
(`--recipe`) on seeds 0, 1 and 2; and the baselines on the table's split: MiniRocket (aeon's
`MiniRocketClassifier`, seed 0; it takes equal lengths, so each series is padded by repeating
its last step) and 1-NN DTW (`KNeighborsTimeSeriesClassifier`, full window), trained on every
train sequence. Prints each test accuracy and the seconds it took (training and testing, or
the baseline's fit and predict), then one table: a row per model, a column per set, the median
over the sets, and on how many sets the model beat 1-NN DTW.
"""

import argparse
import csv
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SETS = ["ArrowHead", "GunPoint", "ItalyPowerDemand", "OSULeaf", "ACSF1", "JapaneseVowels"]
FAMILIES = ["rnn", "lstm", "gru", "transformer", "temporal_conv"]


def train(table: Path, seed: int, overrides: list[str]) -> tuple[float, float]:
    """The test accuracy of one `train.py` run, and the seconds it took."""
    with tempfile.TemporaryDirectory() as run_dir:
        command = [
            sys.executable, str(ROOT / "train.py"), "data=sequences", f"data.path={table}",
            *overrides, f"seed={seed}", f"paths.output_dir={run_dir}",
            "callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null",
        ]  # fmt: skip
        start = time.perf_counter()
        subprocess.run(command, check=True, capture_output=True, cwd=ROOT)
        seconds = time.perf_counter() - start
        with open(Path(run_dir) / "csv" / "metrics.csv") as f:
            (tested,) = [row for row in csv.DictReader(f) if row.get("test/acc")]
    return float(tested["test/acc"]), seconds


def read_split(table: Path, split: str) -> tuple[list, list]:
    """The table's sequences of `split` as `(channels, steps)` arrays, and their labels."""
    import numpy as np

    steps: dict[str, list] = {}
    labels: dict[str, str] = {}
    with open(table) as f:
        for row in csv.DictReader(f):
            if row["split"] == split:
                features = [float(v) for k, v in row.items() if k.startswith("c")]
                steps.setdefault(row["id"], []).append((int(row["time"]), features))
                labels[row["id"]] = row["label"]
    series = [np.array([f for _, f in sorted(rows)]).T for rows in steps.values()]
    return series, [labels[i] for i in steps]


def baselines(table: Path) -> dict[str, tuple[float, float]]:
    """MiniRocket's and 1-NN DTW's test accuracy on the table's split, and their seconds."""
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
    results = {}
    for name, (model, shape) in models.items():
        start = time.perf_counter()
        model.fit(shape(train), np.array(train_labels))
        accuracy = float(np.mean(model.predict(shape(test)) == np.array(test_labels)))
        results[name] = accuracy, time.perf_counter() - start
        # As each finishes: 1-NN DTW on long sets takes hours, and may be stopped.
        print(f"{table.stem} {name}: test accuracy {accuracy:.4f} ({results[name][1]:.0f} s)",
              flush=True)  # fmt: skip
    return results


def write_table(name: str, out: Path) -> None:
    from aeon.datasets import load_classification  # the bench extra

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        table = csv.writer(f)
        number, lengths = 0, []
        for split in ("train", "test"):
            series, labels = load_classification(name, split=split, load_equal_length=False)
            if number == 0:
                channels = range(1, series[0].shape[0] + 1)
                table.writerow(["id", "time", "label", "split", *(f"c{j}" for j in channels)])
            for steps, label in zip(series, labels, strict=True):  # steps: (channels, length)
                for t, step in enumerate(steps.T):
                    table.writerow([number, t, label, split, *(f"{v:.6g}" for v in step)])
                number += 1
                lengths.append(steps.shape[1])
    print(f"{out}: {number} sequences, {min(lengths)}-{max(lengths)} steps", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="+", default=SETS, help="aeon's bundled data sets")
    parser.add_argument("--models", nargs="*", default=FAMILIES, help="families, seed 0")
    parser.add_argument("--recipe", default="temporal_conv", help="the recommended family")
    parser.add_argument("--recipe-seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--baselines", action=argparse.BooleanOptionalAction, default=True,
                        help="MiniRocket and 1-NN DTW (hours for 1-NN DTW on ACSF1)")  # fmt: skip
    parser.add_argument("overrides", nargs="*", help="python train.py overrides, after --")
    args = parser.parse_args()
    runs = [(family, 0) for family in args.models if family != args.recipe]
    runs += [(args.recipe, seed) for seed in args.recipe_seeds]
    cells: dict[str, dict[str, str]] = {}  # row -> set -> "accuracy (seconds)"
    scores: dict[str, dict[str, float]] = {}  # row -> set -> accuracy (the recipe: its median)
    for name in args.sets:
        table = ROOT / "data" / "archive" / f"{name}.csv"
        if not table.is_file():
            write_table(name, table)
        results = {}
        for family, seed in runs:
            overrides = [f"model={family}", *args.overrides]
            results[family, seed] = train(table, seed, overrides)
            print(f"{name} {family} seed {seed}: test/acc {results[family, seed][0]:.4f} "
                  f"({results[family, seed][1]:.0f} s)", flush=True)  # fmt: skip
        for baseline, result in (baselines(table) if args.baselines else {}).items():
            results[baseline, None] = result
        for (model, seed), (accuracy, seconds) in results.items():
            row = model if seed is None else f"`{model}` seed {seed}"
            cells.setdefault(row, {})[name] = f"{accuracy:.3f} ({seconds:.0f} s)"
        recipe = [results[args.recipe, seed][0] for seed in args.recipe_seeds]
        for (model, seed), (accuracy, _) in results.items():
            if seed in (None, 0):
                scores.setdefault(model if seed is None else f"`{model}`", {})[name] = accuracy
        if recipe:
            scores.setdefault(f"`{args.recipe}` (median of seeds)", {})[name] = statistics.median(
                recipe
            )

    extra = f" ({' '.join(args.overrides)})" if args.overrides else ""
    print(f"\nTest accuracy (seconds){extra}:\n")
    print("| model | " + " | ".join(args.sets) + " |")
    print("| --- |" + " ---: |" * len(args.sets))
    for row, by_set in cells.items():
        print(f"| {row} | " + " | ".join(by_set.get(s, "") for s in args.sets) + " |")
    print("\nPer model: the median over the sets, and the sets where it beat 1-NN DTW:\n")
    print("| model | median | above 1-NN DTW |")
    print("| --- | ---: | ---: |")
    dtw = scores.get("1-NN DTW", {})
    for row, by_set in scores.items():
        compared = [s for s in by_set if s in dtw]
        above = sum(by_set[s] > dtw[s] for s in compared)
        print(f"| {row} | {statistics.median(by_set.values()):.3f} | {above} of {len(compared)} |")


if __name__ == "__main__":
    main()
