"""What an Optuna sweep costs between trials, and what pruning saves.

    python benchmarks/sweep.py --epochs 4 --train-batches 10

The sweep: every combination of lr in {3e-3, 1e-7}, batch size in {32, 64} and CNN channels in
{[8, 16], [16, 32]} on the digits (8 trials; Optuna's brute-force sampler runs each once, in a
seeded order). lr=1e-7 cannot learn in a few epochs, so half of the trials are hopeless. Each
trial trains for --epochs epochs of --train-batches batches, validating after each; no test,
no logger, no callbacks but the pruning callback and a clock (SweepClock, below), which notes
each trial's first training step and the end of its fit. Three sweeps, one process each:

- optuna, median pruner (`n_startup_trials=2`, `n_warmup_steps=1`): pruned trials, wall time;
- optuna, nop pruner: every trial to the end; wall time;
- basic: Hydra's own sweeper running the same 8 settings as a plain multirun.

Per-trial overhead: from the end of one trial's fit to the first training step of the next, in
the same process (composing the next config, building data, model and Trainer, the sanity
check; for optuna also ask, tell, trial.yaml and opening the trial in the pruning callback). The
unpruned optuna sweep is set against the basic one: the difference is the Optuna machinery.

Writes sweep.json to benchmarks/results/ (or --out).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback

ROOT = Path(__file__).resolve().parents[1]

SPACE = {
    "model.optimizer.lr": "choice(0.003, 1e-7)",
    "data.batch_size": "choice(32, 64)",
    "model.net.channels": "choice([8, 16], [16, 32])",
}
SEARCH = """
# @package _global_
defaults:
  - optuna
  - override /hparams_search/sampler: brute_force
hydra:
  sweeper:
    n_trials: 8
    params:
""" + "".join(f"      {key}: {value}\n" for key, value in SPACE.items())


class SweepClock(Callback):
    """Appends `{"event": "first_step" | "fit_end", "time": <monotonic s>}` lines to `path`."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.started = False

    def on_train_batch_start(self, trainer: L.Trainer, *args: object) -> None:
        if not self.started:
            self.started = True
            self._note("first_step")

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._note("fit_end")

    def _note(self, event: str) -> None:
        with open(self.path, "a") as file:
            file.write(json.dumps({"event": event, "time": time.monotonic()}) + "\n")


def run_sweep(name: str, overrides: list[str], args: argparse.Namespace, work: Path) -> dict:
    """One `python train.py -m` sweep; its wall time and the gaps between its trials."""
    clock = work / f"{name}.clock"
    command = [
        sys.executable, str(ROOT / "train.py"), "-m", f"paths.log_dir={work / name}",
        "trainer=cpu", "logger=none", "callbacks=none", "test=false",
        f"trainer.max_epochs={args.epochs}", f"++trainer.limit_train_batches={args.train_batches}",
        f"+callbacks.clock={{_target_: sweep.SweepClock, path: '{clock}'}}", *overrides,
    ]  # fmt: skip
    # The clock's module (this file) must be importable in the sweep's process.
    path = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(ROOT / "benchmarks")) if p)
    start = time.perf_counter()
    result = subprocess.run(
        command, cwd=work, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": path}
    )
    wall = time.perf_counter() - start
    if result.returncode != 0:
        sys.exit(f"{name} sweep failed:\n{(result.stdout + result.stderr)[-3000:]}")
    events = [json.loads(line) for line in clock.read_text().splitlines()]
    starts = [e["time"] for e in events if e["event"] == "first_step"]
    ends = [e["time"] for e in events if e["event"] == "fit_end"]
    gaps = [start - end for end, start in zip(ends, starts[1:], strict=False)]
    return {"wall_s": wall, "trials": len(starts), "gaps_s": gaps}


def study_outcome(work: Path, name: str) -> dict:
    import optuna

    from kindling.optuna_sweep import open_storage

    journal = work / name / "train" / "sweeps" / "bench" / "journal.log"
    study = optuna.load_study(study_name="bench", storage=open_storage(str(journal)))
    states = [t.state.name for t in study.trials]
    return {"pruned": states.count("PRUNED"), "best_value": study.best_value}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--train-batches", type=int, default=10, help="per epoch")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "configs" / "hparams_search").mkdir(parents=True)
        (work / "configs" / "hparams_search" / "bench.yaml").write_text(SEARCH)
        search = ["hparams_search=bench", f"hydra.searchpath=[file://{work / 'configs'}]"]
        median = [
            "hparams_search/pruner=median",
            "callbacks.optuna_pruning.pruner.n_startup_trials=2",
            "callbacks.optuna_pruning.pruner.n_warmup_steps=1",
        ]
        basic = [f"{key}={value[len('choice(') : -1]}" for key, value in SPACE.items()]
        results = {
            "optuna_median": run_sweep("optuna_median", search + median, args, work),
            "optuna_nop": run_sweep(
                "optuna_nop", [*search, "hparams_search/pruner=nop"], args, work
            ),
            "basic": run_sweep("basic", basic, args, work),
        }
        for name in ("optuna_median", "optuna_nop"):
            results[name].update(study_outcome(work, name))

    report = {
        "epochs": args.epochs, "train_batches": args.train_batches, "unit": "s", "results": results
    }  # fmt: skip
    (args.out / "sweep.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"8 trials of up to {args.epochs} epochs of {args.train_batches} batches (digits, CPU)")
    header = "| sweep | wall time (s) | pruned | best val/acc_best | gap between trials (s) |"
    print(header)
    print("| --- | --- | --- | --- | --- |")
    for name, row in results.items():
        gaps = row["gaps_s"]
        gap = f"median {statistics.median(gaps):.2f} [{min(gaps):.2f}, {max(gaps):.2f}]"
        pruned = row.get("pruned", "-")
        best = f"{row['best_value']:.3f}" if "best_value" in row else "-"
        print(f"| {name} | {row['wall_s']:.1f} | {pruned} | {best} | {gap} |")


if __name__ == "__main__":
    main()
