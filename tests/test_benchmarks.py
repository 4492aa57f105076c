"""The overhead benchmark runs with one command and reports every side's ratio to plain."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_overhead_benchmark_reports_ratios_of_every_side(tmp_path: Path) -> None:
    command = [
        sys.executable, str(ROOT / "benchmarks" / "overhead.py"), "--models", "rnn",
        "--epochs", "3", "--repeats", "1", "--samples", "512", "--out", str(tmp_path),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]

    report = json.loads((tmp_path / "overhead.json").read_text())
    (row,) = report["results"]
    assert row["model"] == "rnn" and row["steps_per_epoch"] == 4  # 502 samples, batch 128
    for side in ("kindling", "lightning"):
        timed = row[side]
        # Epoch 0 of each side is warm-up: two timed pairs, each ratio one epoch over another.
        assert len(timed["epoch_s"]) == len(timed["plain_epoch_s"]) == 2
        pairs = zip(timed["epoch_s"], timed["plain_epoch_s"], strict=True)
        ratios = [trainer / plain for trainer, plain in pairs]
        assert timed["ratio"] == pytest.approx(sum(ratios) / 2)  # the median of two
        assert timed["ratio_q1"] <= timed["ratio"] <= timed["ratio_q3"]
    kindling_over_lightning = row["kindling"]["ratio"] / row["lightning"]["ratio"]
    assert row["kindling_over_lightning"] == pytest.approx(kindling_over_lightning)

    table = (tmp_path / "overhead.md").read_text()
    assert f"| rnn | {row['plain_ms_per_step']:.2f} |" in table
    assert f"{kindling_over_lightning:.3f} |" in table
    assert f"x{row['kindling']['ratio']:.3f}" in result.stdout
