"""Time a default `python train.py` spends in Python's cyclic garbage collector, with and without
kindling's setting (kindling/garbage_collection.py).

    python benchmarks/collector.py --repeats 5

Two sides, each a fresh `train.py` process run through the same small wrapper (`python -c`):
`kindling` as the repository ships it, and `python defaults` with `long_lived_imports` and
`ending_without_teardown` made no-ops. The wrapper sums the time of every collection
(`gc.callbacks`), split into full collections (generation 2) and the others, until the last atexit
handler has run; `shutdown` is the time from then until the process has ended (interpreter
teardown, if any, timed from outside); `peak MB` the process's largest resident memory
(`ru_maxrss`), as a freeze keeps objects alive that a collection might have freed. Medians of
the repeats, the two sides alternating which runs first.
Writes `collector.json` to `benchmarks/results/` (or `--out`).
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

WRAPPER = """
import atexit, gc, json, os, resource, runpy, sys, time
mode, report = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[3:]
import kindling.garbage_collection as collection
if mode == "python defaults":
    import contextlib
    collection.long_lived_imports = contextlib.nullcontext
    collection.ending_without_teardown = contextlib.nullcontext
spent = {0: 0.0, 1: 0.0, 2: 0.0}
started = [0.0]
def on_collection(phase, info):
    if phase == "start":
        started[0] = time.perf_counter()
    else:
        spent[info["generation"]] += time.perf_counter() - started[0]
gc.callbacks.append(on_collection)
def last_handler():  # after every atexit handler: train.py's end, or registered first
    if on_collection not in gc.callbacks:
        return
    gc.callbacks.remove(on_collection)
    with open(report, "w") as f:
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        json.dump({"full": spent[2], "young": spent[0] + spent[1], "peak_mb": peak_mb,
                   "at_exit": time.time()}, f)
atexit.register(last_handler)
exit_now = os._exit
def end(status):
    last_handler()
    exit_now(status)
os._exit = end
runpy.run_path(sys.argv[0], run_name="__main__")
"""

SIDES = ("kindling", "python defaults")


def run_side(mode: str, train_args: list[str], folder: Path) -> dict[str, float]:
    report = folder / "report.json"
    command = [sys.executable, "-c", WRAPPER, mode, str(report), str(ROOT / "train.py")]
    start = time.perf_counter()
    subprocess.run([*command, *train_args], cwd=folder, check=True, capture_output=True)
    wall = time.perf_counter() - start
    ended = time.time()
    seen = json.loads(report.read_text())
    return {"wall": wall, "full": seen["full"], "young": seen["young"],
            "shutdown": ended - seen["at_exit"], "peak_mb": seen["peak_mb"]}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()
    train_args = [f"trainer.max_epochs={args.epochs}"]
    results: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for repeat in range(args.repeats):
        for side in SIDES if repeat % 2 == 0 else SIDES[::-1]:
            with tempfile.TemporaryDirectory() as folder:
                results[side].append(run_side(side, train_args, Path(folder)))
        print(f"run {repeat + 1}: " + ", ".join(
            f"{side} {results[side][-1]['wall']:.2f} s" for side in SIDES), flush=True)  # fmt: skip
    columns = ("wall", "full", "young", "shutdown", "peak_mb")
    medians = {s: {c: statistics.median(r[c] for r in results[s]) for c in columns} for s in SIDES}
    args.out.mkdir(parents=True, exist_ok=True)
    report = {"epochs": args.epochs, "runs": results, "medians": medians}
    (args.out / "collector.json").write_text(json.dumps(report, indent=2))
    command = f"python train.py {' '.join(train_args)}"
    print(f"\n`{command}`, medians of {args.repeats}")
    print("\n| | process s | full collections s | young collections s | shutdown s | peak MB |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for side in SIDES:
        seconds = [f"{medians[side][c]:.2f}" for c in columns[:-1]]
        print(f"| {side} | " + " | ".join([*seconds, f"{medians[side]['peak_mb']:.0f}"]) + " |")


if __name__ == "__main__":
    main()
