"""The whole `python train.py` process against a plain script doing the same epochs.

    python benchmarks/process.py --epochs 30 --repeats 3

Both are started as fresh processes (imports, data loading, training, validation every epoch,
checkpoints, the final test: everything a user waits for) and timed by the wall clock. Writes
`process.json` to `benchmarks/results/` (or `--out`).
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


def wall_time(command: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--accelerator", default="auto")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    kindling = [
        sys.executable, str(ROOT / "train.py"), f"trainer.max_epochs={args.epochs}",
        f"trainer.accelerator={args.accelerator}", "callbacks.early_stopping=null",
    ]  # fmt: skip
    plain = [sys.executable, str(ROOT / "benchmarks" / "plain_train.py"), f"--epochs={args.epochs}"]
    times: dict[str, list[float]] = {"plain": [], "kindling": []}
    for repeat in range(args.repeats):
        order = [("plain", plain), ("kindling", kindling)]
        for name, command in order if repeat % 2 == 0 else order[::-1]:
            with tempfile.TemporaryDirectory() as folder:
                times[name].append(wall_time(command, Path(folder)))
    plain_s, kindling_s = statistics.median(times["plain"]), statistics.median(times["kindling"])
    report = {
        "epochs": args.epochs,
        "plain_s": times["plain"],
        "kindling_s": times["kindling"],
        "ratio": kindling_s / plain_s,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "process.json").write_text(json.dumps(report, indent=2))
    print(
        f"{args.epochs} epochs: plain {plain_s:.2f} s, kindling {kindling_s:.2f} s "
        f"(median of {args.repeats}); kindling / plain = {kindling_s / plain_s:.3f}"
    )


if __name__ == "__main__":
    main()
