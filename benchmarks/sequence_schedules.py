"""Does the learning-rate schedule cost the sequence models accuracy? Seeds per schedule.

    python benchmarks/sequence_schedules.py --models rnn lstm transformer --epochs 8 \
        --seeds 0 1 2 3 4

Trains `python train.py model=<model> trainer.max_epochs=<epochs> seed=<seed>` in-process on the
default data (scikit-learn's digits) with each schedule, and prints best val/acc and test/acc:

- `cosine to 0`: `warmup_cosine` stepped every optimizer step, down to 0 at the last one.
- `epoch cosine`: the first release's, torch's `CosineAnnealingLR(T_max=epochs)` stepped once
  per epoch (the last epoch trains at 4% of the peak rate rather than ending at 0).
- `cosine to 10%`: the same, ending at a tenth of the peak rate (nanoGPT's `min_lr`); the
  sequence models' default.
- `constant`: no schedule.

Writes `sequence_schedules.json` to `benchmarks/results/` (or `--out`).
"""

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from augment import ROOT, test_accuracy

SCHEDULES = {
    "cosine to 0": ["model.scheduler.min_lr_ratio=0.0"],
    "epoch cosine": [
        "model.scheduler._target_=torch.optim.lr_scheduler.CosineAnnealingLR",
        "~model.scheduler.warmup_ratio", "~model.scheduler.min_lr_ratio",
        "+model.scheduler.T_max=${trainer.max_epochs}", "model.scheduler_interval=epoch",
    ],
    "cosine to 10%": ["model.scheduler.min_lr_ratio=0.1"],
    "constant": ["model.scheduler=null"],
}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["rnn", "lstm", "transformer"])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--schedules", nargs="+", default=list(SCHEDULES))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    args = parser.parse_args()
    logging.disable(logging.WARNING)

    results: dict[str, dict[str, dict[str, list[float]]]] = {}
    for model in args.models:
        for schedule in args.schedules:
            runs = results.setdefault(model, {}).setdefault(schedule, {"val": [], "test": []})
            for seed in args.seeds:
                overrides = [
                    f"model={model}", f"seed={seed}", "trainer=cpu",
                    f"trainer.max_epochs={args.epochs}", *SCHEDULES[schedule],
                    "callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null",
                    "callbacks.plots=null", "logger=csv",
                ]  # fmt: skip
                start = time.perf_counter()
                with tempfile.TemporaryDirectory() as folder:
                    best_val, test = test_accuracy(overrides, Path(folder), with_best_val=True)
                runs["val"].append(best_val)
                runs["test"].append(test)
                seconds = time.perf_counter() - start
                print(f"model={model:<12} {schedule:<13} seed {seed}  best val/acc {best_val:.4f}"
                      f"  test/acc {test:.4f}  ({seconds:.0f} s)", flush=True)  # fmt: skip

    print(f"\ndigits, {args.epochs} epochs, seeds {args.seeds}: mean (standard deviation)")
    for model, schedules in results.items():
        for schedule, runs in schedules.items():
            val, test = runs["val"], runs["test"]
            print(f"model={model:<12} {schedule:<13} best val/acc {statistics.mean(val):.4f} "
                  f"({statistics.stdev(val):.4f})  test/acc {statistics.mean(test):.4f} "
                  f"({statistics.stdev(test):.4f})")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    result = {"args": {k: str(v) for k, v in vars(args).items()}, "results": results}
    (args.out / "sequence_schedules.json").write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    torch.set_num_threads(1)  # runs of a machine shared with others compare better
    sys.exit(main())
