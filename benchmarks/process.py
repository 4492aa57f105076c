"""The whole `python train.py` process against a plain script doing the same epochs.

    python benchmarks/process.py --workload digits --epochs 10 --repeats 5
    python benchmarks/process.py --workload mnist --epochs 2 --repeats 5

Three sides: `plain_train.py` (the script a user writes by hand), `lightning_train.py` (the same
through a bare Lightning Trainer: the floor of any Lightning script) and `python train.py`.
Each is started as a fresh process (imports, data loading, training, validation every epoch,
checkpoints, the final test: everything a user waits for) and timed by the wall clock; one
repeat runs the three back to back, each repeat in a different order. Workloads:

- digits: the default experiment (CNN on scikit-learn's 8x8 digits, batch 64);
- mnist: `data=mnist` (CNN on 28x28 images, batch 128) from MNIST-sized IDX files (60,000 train
  and 10,000 test images of random pixels) written in MNIST's on-disk format, so that nothing
  needs downloading. Both sides read them with torchvision and use no DataLoader workers.

Writes `process_<workload>.json` to `benchmarks/results/` (or `--out`).
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))  # the IDX writer the data tests use

from torchvision_files import write_mnist  # noqa: E402


def wall_time(command: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def commands(workload: str, epochs: int, accelerator: str, data_dir: Path) -> dict[str, list]:
    kindling = [
        sys.executable, str(ROOT / "train.py"), f"trainer.max_epochs={epochs}",
        f"trainer.accelerator={accelerator}",
    ]  # fmt: skip
    plain = [sys.executable, str(ROOT / "benchmarks" / "plain_train.py"), f"--epochs={epochs}"]
    lightning = [sys.executable, str(ROOT / "benchmarks" / "lightning_train.py"), *plain[2:]]
    if workload == "mnist":
        write_mnist(data_dir, num_train=60_000, num_test=10_000)
        kindling += ["data=mnist", "data.num_workers=0", f"paths.data_dir={data_dir}"]
        for script in (plain, lightning):
            script += ["--data=mnist", f"--data-dir={data_dir}", "--batch-size=128"]
    return {"plain": plain, "lightning": lightning, "kindling": kindling}


def paired_ratio(numerator: list[float], denominator: list[float]) -> dict[str, float]:
    """Median and range of the per-repeat ratios: runs seconds apart see the same machine."""
    ratios = sorted(n / d for n, d in zip(numerator, denominator, strict=True))
    return {"median": statistics.median(ratios), "min": ratios[0], "max": ratios[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=["digits", "mnist"], default="digits")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    names = ["plain", "lightning", "kindling"]
    times: dict[str, list[float]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as data_dir:
        sides = commands(args.workload, args.epochs, args.accelerator, Path(data_dir))
        for repeat in range(args.repeats):
            for name in names[repeat % 3 :] + names[: repeat % 3]:  # each side first in turn
                with tempfile.TemporaryDirectory() as folder:
                    times[name].append(wall_time(sides[name], Path(folder)))
            print(f"run {repeat + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in names),
                  flush=True)  # fmt: skip
    report = {
        "workload": args.workload,
        "epochs": args.epochs,
        **{f"{name}_s": times[name] for name in names},
        "ratios": {
            f"{a} / {b}": paired_ratio(times[a], times[b])
            for a, b in (("lightning", "plain"), ("kindling", "plain"), ("kindling", "lightning"))
        },
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"process_{args.workload}.json").write_text(json.dumps(report, indent=2))
    medians = ", ".join(f"{n} {statistics.median(times[n]):.2f} s" for n in names)
    print(f"{args.workload}, {args.epochs} epochs, wall time, medians of {args.repeats}: {medians}")
    for label, ratio in report["ratios"].items():
        print(f"  {label} = {ratio['median']:.3f} (range {ratio['min']:.3f}-{ratio['max']:.3f})")


if __name__ == "__main__":
    main()
