"""A resumed run's metrics.csv keeps the epochs it trained, whichever checkpoint it tests."""

import csv
from pathlib import Path

from omegaconf import open_dict

from kindling.train import run

# The best checkpoint is always the first: the test after the resumed epoch loads it.
FIRST_IS_BEST = ["callbacks.model_checkpoint.monitor=step", "callbacks.model_checkpoint.mode=min"]
TINY = ["trainer=cpu", "trainer.limit_train_batches=3", "trainer.limit_val_batches=2",
        "trainer.limit_test_batches=2", "callbacks.rich_progress_bar=null",
        "callbacks.rich_model_summary=null", *FIRST_IS_BEST]  # fmt: skip


def test_testing_an_older_best_checkpoint_keeps_the_resumed_epochs(
    compose_config, tmp_path: Path
) -> None:
    for overrides in [["trainer.max_epochs=1"], ["trainer.max_epochs=2", "ckpt_path=last"]]:
        cfg = compose_config(*TINY, *overrides)
        with open_dict(cfg):
            cfg.paths.output_dir = str(tmp_path / "logs" / "train" / "runs" / "first")
        run(cfg)
    with open(tmp_path / "logs" / "train" / "runs" / "first" / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [r["epoch"] for r in rows if r["train/loss"]] == ["0", "1"]
    assert [r["epoch"] for r in rows if r["val/loss"]] == ["0", "1"]
    assert len([r for r in rows if r["test/acc"]]) == 2
