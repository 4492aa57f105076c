"""`python train.py trainer.max_epochs=3` with torch's default threads against one thread, on an
idle machine and on one where other processes keep every core busy (a shared CI runner, a laptop
compiling something): the wall time of each run, median of `--repeats`.

    python benchmarks/threads.py [--repeats 3]
"""

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMAND = [sys.executable, str(ROOT / "train.py"), "trainer.max_epochs=3"]


def spin() -> None:  # a process that keeps one core busy
    while True:
        pass


def timed_run(threads: str | None) -> float:
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        subprocess.run([*COMMAND, f"paths.log_dir={folder}"], env=env, check=True,
                       capture_output=True, cwd=folder)  # fmt: skip
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cores = len(os.sched_getaffinity(0))
    print(f"{cores} cores; `python train.py trainer.max_epochs=3`, median of {args.repeats} runs")
    for busy in (False, True):
        spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(cores * busy)]
        for spinner in spinners:
            spinner.start()
        try:
            for threads in (None, "1"):
                seconds = statistics.median(timed_run(threads) for _ in range(args.repeats))
                label = "default threads" if threads is None else "OMP_NUM_THREADS=1"
                where = f"{cores} busy processes beside it" if busy else "idle machine"
                print(f"{where:>26}, {label:>17}: {seconds:6.1f} s")
        finally:
            for spinner in spinners:
                spinner.terminate()


if __name__ == "__main__":
    main()
