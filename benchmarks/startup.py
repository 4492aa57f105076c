"""How long `python train.py` takes to answer: the commands that only compose a config, and a
default run's time to its first training step and to its end.

    python benchmarks/startup.py --repeats 5

Each command is a fresh process, timed by the wall clock from before it starts; the first
training step's moment is written by a callback the run loads (`+callbacks=...`), at the start
of that step. Commands, each run `--repeats` times in turn:

- `--help`, `--cfg job` and one shell completion (`-sc query=bash` with `COMP_LINE`, what bash
  runs on each press of TAB): Hydra composes the config, nothing is trained;
- the default run, `python train.py` (the digits CNN, every default callback, the test at the
  end), on the CPU.

Prints the median and range of each. That the composing commands import neither torch nor
Lightning is asserted by tests/test_configs.py.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FIRST_STEP_PROBE = """
import time
from pathlib import Path

import lightning as L


class FirstStep(L.Callback):
    def __init__(self, file: str) -> None:
        self.file = Path(file)

    def on_train_batch_start(self, trainer, *args) -> None:
        if not self.file.exists():
            self.file.write_text(repr(time.time()))
"""

COMPOSING = {
    "--help": ["--help"],
    "--cfg job": ["--cfg", "job"],
    "one shell completion": ["-sc", "query=bash"],
}


def wall_time(command: list[str], cwd: Path, env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(command, cwd=cwd, env=env, check=True, capture_output=True)
    return time.perf_counter() - start


def summary(times: list[float]) -> str:
    return f"median {statistics.median(times):.2f} s (range {min(times):.2f}-{max(times):.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    env = {**os.environ, "COMP_LINE": "python train.py trainer.max_"}
    train_py = [sys.executable, str(ROOT / "train.py")]
    times: dict[str, list[float]] = {name: [] for name in [*COMPOSING, "first step", "whole run"]}
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        (folder / "first_step_probe.py").write_text(FIRST_STEP_PROBE)
        run_env = {**env, "PYTHONPATH": os.pathsep.join([str(folder), env.get("PYTHONPATH", "")])}
        for repeat in range(args.repeats):
            for name, composing_args in COMPOSING.items():
                times[name].append(wall_time([*train_py, *composing_args], folder, env))
            marker = folder / f"first_step_{repeat}"
            probe = [
                "+callbacks.first_step._target_=first_step_probe.FirstStep",
                f"+callbacks.first_step.file={marker}",
            ]
            start = time.time()
            times["whole run"].append(
                wall_time([*train_py, "trainer.accelerator=cpu", *probe], folder, run_env)
            )
            times["first step"].append(float(marker.read_text()) - start)
    print(f"python train.py, wall time of a fresh process, {args.repeats} repeats:")
    for name, measured in times.items():
        label = "the default run, to its first training step" if name == "first step" else name
        label = "the default run, whole" if name == "whole run" else label
        print(f"  {label}: {summary(measured)}")


if __name__ == "__main__":
    main()
