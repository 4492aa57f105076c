"""The prepared GPU check (benchmarks/gpu_check.py) cannot rot between GPU runs: its CPU dry run
goes through every step, and a step that hangs costs its own time limit, not the rest."""

import ast
import importlib.metadata as metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import PYTHON, ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check
import gpu_wheels


@pytest.mark.slow
def test_the_cpu_dry_run_goes_through_every_step_and_reports_its_numbers(tmp_path: Path) -> None:
    command = [*PYTHON, str(ROOT / "benchmarks" / "gpu_check.py"), "--cpu", "--out", str(tmp_path)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert result.returncode == 0, (tmp_path / "summary.md").read_text()[-4000:]

    steps = summary["steps"]
    assert list(steps) == [
        "device",
        "gpu_tests",
        "default_run",
        "overhead",
        "language_model",
        "ddp",
    ]
    assert steps["device"]["versions"]["lightning"] and steps["device"]["gpu"] is None
    # Every gpu test was collected and skipped here (no CUDA), none failed.
    assert steps["gpu_tests"]["tests"] >= 5 and steps["gpu_tests"]["failures"] == 0
    for run in (steps["default_run"]["default"], steps["default_run"]["float32"]):
        assert run["precision"] == "32-true" and run["run_folders"] == 1 and run["test_acc"] > 0
    precisions = {label.split()[1] for label in steps["overhead"] if " " in label}
    assert precisions == {"32-true", "bf16-mixed"}
    rows = [row for label, row in steps["overhead"].items() if " " in label]
    assert len(rows) == 4 and all(row["kindling_over_plain"] > 0 for row in rows)
    language_model = steps["language_model"]["lm/lm_throughput"]
    assert language_model["tokens_per_s"] > 0 and language_model["flops_per_batch"] > 0
    assert steps["ddp"]["ddp"] | {"test_acc": None} == {
        "test_acc": None, "precision": "32-true", "run_folders": 1, "ranks": 2,
    }  # fmt: skip
    # summary.json, summary.md and a log per step: what a GPU machine sends back (8 files at most).
    assert len(list(tmp_path.iterdir())) == 8


def test_a_step_past_its_limit_is_stopped_and_the_next_one_runs(tmp_path: Path) -> None:
    sleeper = [sys.executable, "-c", "import subprocess, sys; "
               "subprocess.run([sys.executable, '-c', 'import time; time.sleep(60)'])"]  # fmt: skip
    hanging = gpu_check.Step("hanging", 2, [sleeper, ["true"]], lambda outputs, work: {})
    quick = gpu_check.Step("quick", 10, [["echo", "done"]], lambda outputs, work: {"out": outputs})
    stopped = gpu_check.run_step(hanging, tmp_path, tmp_path)
    assert stopped["status"] == "timed out" and stopped["seconds"] < 10
    assert gpu_check.run_step(quick, tmp_path, tmp_path) == {
        "status": "passed", "seconds": pytest.approx(0, abs=5), "out": ["done\n"],
    }  # fmt: skip


def test_the_wheels_are_what_kindling_needs_and_the_gpu_machine_lacks() -> None:
    have = gpu_wheels.machine_packages(ROOT / "benchmarks" / "gpu_machine.txt")
    missing = gpu_wheels.missing_requirements(["kindling", *gpu_wheels.TEST_RUNNER], have)
    # What a run needs and that machine has not: Hydra and its parser, the loaders' state.
    assert {"hydra-core", "omegaconf", "antlr4-python3-runtime", "torchdata"} <= set(missing)
    # What it has, and what only a package it has needs (its own requirements are there too).
    assert not {"torch", "lightning", "pytest", "numpy", "nvidia-cublas"} & set(missing)
    assert "kindling" in missing  # travels as source: main() leaves it out of the downloads


def test_the_gpu_machine_can_import_every_test_module() -> None:
    """`pytest -m gpu` collects every test module first: one import the machine cannot satisfy
    stops the whole step (jsonschema did, on an H100)."""
    have = gpu_wheels.machine_packages(ROOT / "benchmarks" / "gpu_machine.txt")
    there = have | set(gpu_wheels.missing_requirements(["kindling", *gpu_wheels.TEST_RUNNER], have))
    local = {p.stem for p in [*(ROOT / "tests").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]}
    distributions = metadata.packages_distributions()
    local.add("kindling")
    lacking = set()
    for test_file in (ROOT / "tests").glob("*.py"):
        for node in ast.parse(test_file.read_text()).body:  # top-level imports only
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            names += [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            for top in {name.split(".")[0] for name in names} - local - sys.stdlib_module_names:
                if not {gpu_wheels.normalise(d) for d in distributions[top]} & there:
                    lacking.add(f"{test_file.name}: {top}")
    assert not lacking
