"""The overhead benchmark runs with one command and reports every side's ratio to plain; its
instruction counter counts the same work the same."""

import json
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from forked import run_forked
from helpers import QUIET, ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import overhead

SIDES = ("kindling", "lightning")


def test_overhead_benchmark_reports_ratios_of_every_side(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    # The command's own main, in this process: a `python overhead.py` would import torch,
    # Lightning and kindling again, seconds that measure nothing here.
    command = [
        "overhead.py", "--models", "rnn",
        "--epochs", "4", "--repeats", "1", "--samples", "64", "--batch-size", "16",
        "--out", str(tmp_path),
        "--precision", "bf16-mixed",  # not the Trainers' default: each side must be given it
    ]  # fmt: skip
    monkeypatch.setattr(sys, "argv", command)
    monkeypatch.chdir(tmp_path)
    overhead.main()
    stdout = capsys.readouterr().out

    report = json.loads((tmp_path / "overhead.json").read_text())
    (row,) = report["results"]
    assert row["model"] == "rnn" and row["steps_per_epoch"] == 4  # 63 samples, batch 16
    for side in SIDES:
        timed = row[side]
        # Epoch 0 of each side is warm-up: three timed pairs, each a side epoch over a plain one.
        assert len(timed["epochs"]) == len(timed["plain_epochs"]) == 3
        assert min(timed["epochs"] + timed["plain_epochs"]) > 0
        pairs = zip(timed["epochs"], timed["plain_epochs"], strict=True)
        ratios = sorted(trainer / plain for trainer, plain in pairs)
        # Of three ratios the median is the middle one (not the mean), the quartiles the others.
        assert [timed["ratio_q1"], timed["ratio"], timed["ratio_q3"]] == pytest.approx(ratios)
    # Every side at the same precision: the Trainers as configured, each net's output as run.
    assert report["precision"] == "bf16-mixed" and "DataLoader" in report["placement"]
    assert row["kindling"]["precision"] == row["lightning"]["precision"] == "bf16-mixed"
    dtypes = [row["plain_output_dtype"], *(row[side]["output_dtype"] for side in SIDES)]
    assert dtypes == ["bfloat16"] * 3
    kindling_over_lightning = row["kindling"]["ratio"] / row["lightning"]["ratio"]
    assert row["kindling_over_lightning"] == pytest.approx(kindling_over_lightning)

    table = (tmp_path / "overhead.md").read_text()
    assert report["unit"] == "s"
    assert f"| rnn | {1000 * row['plain_per_step']:.2f} |" in table
    assert f"{kindling_over_lightning:.3f} |" in table
    assert f"x{row['kindling']['ratio']:.3f}" in stdout


@pytest.mark.skipif(
    shutil.which("valgrind") is None or shutil.which("cc") is None,
    reason="needs valgrind and a C compiler",
)
def test_instruction_counter_counts_equal_work_equally_and_double_work_double(
    tmp_path: Path,
) -> None:
    script = tmp_path / "count.py"
    script.write_text(
        textwrap.dedent(f"""
            import json, sys
            sys.path.insert(0, {str(ROOT / "benchmarks")!r})
            from meters import InstructionCounter, exec_under_callgrind, under_callgrind

            if not under_callgrind():
                exec_under_callgrind(sys.argv)
            counter = InstructionCounter()
            counts = []
            for n in (100_000, 100_000, 100_000, 200_000):  # the first is warm-up
                counter.start()
                sum(1 for _ in range(n))
                counts.append(counter.stop())
            print(json.dumps(counts[1:]))
        """)
    )
    result = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    once, again, twice = json.loads(result.stdout.splitlines()[-1])
    assert once > 100_000  # a Python loop costs many instructions per iteration
    assert again == pytest.approx(once, rel=1e-3)
    assert twice == pytest.approx(2 * once, rel=0.01)


@pytest.mark.slow
def test_loaded_lines_reports_the_kindling_files_a_run_loaded(tmp_path: Path) -> None:
    script = ROOT / "benchmarks" / "loaded_lines.py"
    result = run_forked(script, ["debug=fdr", *QUIET], cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    total = re.search(r"kindling source loaded: (\d+) lines in (\d+) files", result.stdout)
    assert total, result.stdout[-3000:]
    listed = re.findall(r"^\s+(\d+)\s+(\S+)$", result.stdout, re.M)
    assert sum(int(lines) for lines, _ in listed) == int(total[1]) and len(listed) == int(total[2])
    assert {"train.py", "src/kindling/train.py"} <= {path for _, path in listed}
