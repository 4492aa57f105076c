"""The whole `python train.py` process against a plain script doing the same epochs.

    python benchmarks/process.py --workload digits --epochs 10 --repeats 5
    python benchmarks/process.py --workload mnist --epochs 2 --repeats 5

Both are started as fresh processes (imports, data loading, training, validation every epoch,
checkpoints, the final test: everything a user waits for) and timed by the wall clock, back to
back, alternating which goes first. Workloads:

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
        f"trainer.accelerator={accelerator}", "callbacks.early_stopping=null",
    ]  # fmt: skip
    plain = [sys.executable, str(ROOT / "benchmarks" / "plain_train.py"), f"--epochs={epochs}"]
    if workload == "mnist":
        write_mnist(data_dir, num_train=60_000, num_test=10_000)
        kindling += ["data=mnist", "data.num_workers=0", f"paths.data_dir={data_dir}"]
        plain += ["--data=mnist", f"--data-dir={data_dir}", "--batch-size=128"]
    return {"plain": plain, "kindling": kindling}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", choices=["digits", "mnist"], default="digits")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    times: dict[str, list[float]] = {"plain": [], "kindling": []}
    with tempfile.TemporaryDirectory() as data_dir:
        sides = commands(args.workload, args.epochs, args.accelerator, Path(data_dir))
        for repeat in range(args.repeats):
            order = ["plain", "kindling"] if repeat % 2 == 0 else ["kindling", "plain"]
            for name in order:
                with tempfile.TemporaryDirectory() as folder:
                    times[name].append(wall_time(sides[name], Path(folder)))
            print(f"run {repeat + 1}: plain {times['plain'][-1]:.2f} s, "
                  f"kindling {times['kindling'][-1]:.2f} s", flush=True)  # fmt: skip
    # Back-to-back runs: their ratio cancels the drift of a shared machine.
    ratios = sorted(k / p for k, p in zip(times["kindling"], times["plain"], strict=True))
    plain_s, kindling_s = statistics.median(times["plain"]), statistics.median(times["kindling"])
    report = {
        "workload": args.workload,
        "epochs": args.epochs,
        "plain_s": times["plain"],
        "kindling_s": times["kindling"],
        "ratio": statistics.median(ratios),
        "ratio_min": ratios[0],
        "ratio_max": ratios[-1],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"process_{args.workload}.json").write_text(json.dumps(report, indent=2))
    print(
        f"{args.workload}, {args.epochs} epochs: plain {plain_s:.2f} s, "
        f"kindling {kindling_s:.2f} s (medians of {args.repeats}); "
        f"kindling / plain = {report['ratio']:.3f} (range {ratios[0]:.3f}-{ratios[-1]:.3f})"
    )


if __name__ == "__main__":
    main()
