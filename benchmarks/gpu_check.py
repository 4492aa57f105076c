"""The GPU check: kindling's CUDA paths and GPU numbers, in at most 655 s (the steps' limits).

    bash benchmarks/gpu_check.sh             # on the GPU machine (installs .whl/ first, if there)
    bash benchmarks/gpu_check.sh --only device gpu_tests              # or in two calls of at most
    bash benchmarks/gpu_check.sh --only default_run overhead language_model ddp  # 345 s and 310 s
    python benchmarks/gpu_check.py --cpu     # every step tiny, on the CPU: the suite runs this

On a machine without network, fetch what it lacks first, where the package registry is reachable:
`python benchmarks/gpu_wheels.py` (wheels into .whl/, which travels with the working tree).

The steps, in this order, each in its own processes under its own time limit, so one that fails
or hangs does not cost the rest:

1. device: the card, driver and library versions; `python -m kindling.device_report`;
2. gpu_tests: `pytest -m gpu` (one process: one GPU);
3. default_run: `python train.py` in the precision the default picks, then in `32-true`;
4. overhead: `benchmarks/overhead.py`, kindling / bare Lightning / a plain loop per epoch, the CNN
   and the Transformer, in float32, then in bf16 (every side in the same precision);
5. language_model: `benchmarks/lm_throughput.py`, GPT-2-small's body on synthetic text, bf16,
   without and with `model.compile=true`: tokens/s, MFU and the compile warm-up apart;
6. ddp: two processes on the one GPU with gloo (`trainer=ddp_one_gpu`): one run folder.

Every data set is shipped (digits) or generated (images, text). Writes `summary.json`,
`summary.md` and one log per step (8 files) to `$OUT` when set, else to `--out`.
"""

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PYTHON = sys.executable
CPU_SLOWER = 4
TRAIN_QUIET = ["callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null"]

VERSIONS = """
import json, platform, importlib.metadata as m
import torch
names = ["torch", "lightning", "torchvision", "torchmetrics", "hydra-core", "omegaconf", "timm",
         "torchdata", "litdata", "optuna", "onnxruntime"]
versions = {}
for name in names:
    try:
        versions[name] = m.version(name)
    except m.PackageNotFoundError:
        versions[name] = None
cuda = torch.cuda.is_available()
print(json.dumps({
    "python": platform.python_version(), "cuda_build": torch.version.cuda,
    "cudnn": torch.backends.cudnn.version() if cuda else None,
    "gpu": torch.cuda.get_device_name() if cuda else None,
    "capability": ".".join(map(str, torch.cuda.get_device_capability())) if cuda else None,
    "versions": versions,
}))
"""


@dataclass
class Step:
    """Commands run one after another under one time limit; `read` turns their output into
    the step's numbers."""

    name: str
    limit_s: int
    commands: list[list[str]]
    read: Callable[[list[str], Path], dict]
    result: dict = field(default_factory=dict)


def run_step(step: Step, out: Path, work: Path) -> dict:
    """Run `step`'s commands, log their output to `<out>/<name>.log`, and return its summary."""
    log_path = out / f"{step.name}.log"
    outputs: list[str] = []
    started = time.monotonic()
    status = "passed"
    with log_path.open("w") as log:
        for command in step.commands:
            left = step.limit_s - (time.monotonic() - started)
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            code, text = run_command(command, left, work)
            log.write(text + f"\n[exit {code}]\n\n")
            log.flush()
            outputs.append(text)
            if code != 0:
                status = "timed out" if code is None else f"failed (exit {code})"
                break
    summary = {"status": status, "seconds": round(time.monotonic() - started, 1)}
    try:
        summary.update(step.read(outputs, work))
    except Exception as error:  # a step's numbers missing is a finding, not a crash of the check
        summary["read_error"] = f"{type(error).__name__}: {error}"
        if status == "passed":
            summary["status"] = "failed (no numbers)"
    if summary["status"] != "passed":
        summary["log_tail"] = "\n".join("\n".join(outputs).splitlines()[-25:])
    return summary


def run_command(command: list[str], limit_s: float, cwd: Path) -> tuple[int | None, str]:
    """The exit code (None when the limit stopped it) and the merged output of `command`. A
    stopped command's whole process group goes: DDP ranks and pytest workers with it."""
    if limit_s <= 0:
        return None, "(no time left in this step)"
    process = subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip
    try:
        text, _ = process.communicate(timeout=limit_s)
        return process.returncode, text
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        text, _ = process.communicate()
        return None, text


# ------------------------------------------------------------------------------------------------
# What each step's output says


def read_device(outputs: list[str], work: Path) -> dict:
    facts = json.loads(outputs[0].strip().splitlines()[-1])
    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True, text=True, check=False,
    ) if shutil.which("nvidia-smi") else None  # fmt: skip
    facts["nvidia_smi"] = smi.stdout.strip() if smi and smi.returncode == 0 else None
    return facts


def read_junit(outputs: list[str], work: Path) -> dict:
    suite = ET.parse(work / "gpu_tests.xml").getroot().find("testsuite")
    counts = {key: int(suite.get(key, 0)) for key in ("tests", "failures", "errors", "skipped")}
    failed = [
        f"{case.get('classname')}::{case.get('name')}"
        for case in suite.iter("testcase")
        if case.find("failure") is not None or case.find("error") is not None
    ]
    return {**counts, "passed": counts["tests"] - sum(counts[k] for k in counts if k != "tests"),
            "failed_tests": failed}  # fmt: skip


def read_runs(labels: list[str]):
    """The test/acc, precision and wall time of each `python train.py` in a step."""

    def read(outputs: list[str], work: Path) -> dict:
        runs = {}
        for label, text in zip(labels, outputs, strict=False):
            folders = sorted((work / label / "logs").glob("*/runs/*"))
            results = folders[-1] / "results.yaml" if folders else None
            runs[label] = {
                "test_acc": _yaml_value(results, "test/acc"),
                "precision": _precision(text),
                "run_folders": len(folders),
                # Lightning names every rank it starts: "GLOBAL_RANK: 1, MEMBER: 2/2".
                "ranks": len(set(re.findall(r"GLOBAL_RANK: (\d+)", text))) or 1,
            }
        return runs

    return read


def read_json_reports(pattern: str):
    def read(outputs: list[str], work: Path) -> dict:
        return {
            str(path.relative_to(work).with_suffix("")): json.loads(path.read_text())
            for path in sorted(work.glob(pattern))
        }

    return read


def read_overhead(outputs: list[str], work: Path) -> dict:
    reports = read_json_reports("overhead_*/overhead.json")(outputs, work)
    table = {}
    for report in reports.values():
        for row in report["results"]:
            precision = report["settings"].get("precision")
            table[f"{row['model']} {precision}"] = {
                "plain_ms_per_step": 1000 * row["plain_per_step"],
                "kindling_over_plain": row["kindling"]["ratio"],
                "lightning_over_plain": row["lightning"]["ratio"],
            }
    return table


def _yaml_value(path: Path | None, key: str) -> float | None:
    if path is None or not path.is_file():
        return None
    return yaml.safe_load(path.read_text()).get(key)


def _precision(text: str) -> str:
    match = re.search(r"Using (bfloat16|16bit) Automatic Mixed Precision", text)
    return {"bfloat16": "bf16-mixed", "16bit": "16-mixed"}[match.group(1)] if match else "32-true"


# ------------------------------------------------------------------------------------------------
# The steps


def steps(cpu: bool, work: Path) -> list[Step]:
    """The six steps: full size on a GPU; with `cpu`, the same commands, tiny, on the CPU."""

    def train(label: str, *overrides: str) -> list[str]:
        where = [f"paths.log_dir={work / label / 'logs'}", f"paths.data_dir={work / 'data'}"]
        return [PYTHON, str(ROOT / "train.py"), *where, *TRAIN_QUIET, *overrides]

    tiny = ["trainer=cpu", "debug=limit", "trainer.max_epochs=1"] if cpu else []
    overhead = [PYTHON, str(ROOT / "benchmarks" / "overhead.py"), "--models", "cnn", "transformer"]
    overhead += (
        ["--epochs", "2", "--repeats", "1", "--samples", "64", "--batch-size", "32"]
        if cpu
        else ["--repeats", "1", "--epochs", "6"]
    )
    lm = [PYTHON, str(ROOT / "benchmarks" / "lm_throughput.py")]
    lm += (
        ["--size", "tiny", "--steps", "3", "--warmup", "1", "--precision", "32-true"] if cpu else []
    )
    ddp = (
        ["trainer=ddp_cpu", "debug=limit", "trainer.max_epochs=1"]
        if cpu
        else ["trainer=ddp_one_gpu", "trainer.max_epochs=3"]
    )
    return [
        Step("device", 45, [[PYTHON, "-c", VERSIONS], [PYTHON, "-m", "kindling.device_report"]],
             read_device),
        Step("gpu_tests", 300, [[PYTHON, "-m", "pytest", "-m", "gpu", "-n", "0", "-v",
                                 "-p", "no:cacheprovider", f"--junitxml={work / 'gpu_tests.xml'}",
                                 str(ROOT / "tests")]], read_junit),
        Step("default_run", 60, [train("default", *tiny),
                                 train("float32", *tiny, "trainer.precision=32-true")],
             read_runs(["default", "float32"])),
        Step("overhead", 80, [[*overhead, "--precision", precision, "--out",
                                str(work / f"overhead_{precision}")]
                               for precision in ("32-true", "bf16-mixed")], read_overhead),
        Step("language_model", 100, [[*lm, "--out", str(work / "lm")]]
             + ([] if cpu else [[*lm, "--compile", "--out", str(work / "lm")]]),
             read_json_reports("lm/lm_throughput*.json")),
        Step("ddp", 70, [train("ddp", *ddp)],
             read_runs(["ddp"])),
    ]  # fmt: skip


def markdown(summary: dict) -> str:
    lines = [f"# GPU check ({summary['mode']}), {summary['finished']}", ""]
    device = summary["steps"].get("device", {})
    lines += [f"Device: {device.get('gpu') or 'CPU'}; nvidia-smi: {device.get('nvidia_smi')}; "
              f"CUDA build {device.get('cuda_build')}, cuDNN {device.get('cudnn')}; "
              f"{json.dumps(device.get('versions'))}", ""]  # fmt: skip
    lines += ["| step | status | seconds |", "| --- | --- | ---: |"]
    for name, result in summary["steps"].items():
        lines.append(f"| {name} | {result['status']} | {result['seconds']} |")
    for name, result in summary["steps"].items():
        if name == "device":
            continue
        shown = {k: v for k, v in result.items() if k not in ("status", "seconds", "log_tail")}
        lines += ["", f"## {name}", "", "```json", json.dumps(shown, indent=1), "```"]
        if "log_tail" in result:
            lines += ["", "```", result["log_tail"], "```"]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="every step tiny, on the CPU")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_check")
    parser.add_argument("--only", nargs="+", help="run only these steps (by name)")
    args = parser.parse_args()
    out = Path(os.environ["OUT"]) if os.environ.get("OUT") else args.out
    out.mkdir(parents=True, exist_ok=True)

    summary = {"mode": "cpu dry run" if args.cpu else "gpu", "steps": {}}
    with tempfile.TemporaryDirectory(prefix="kindling-gpu-check-") as tmp:
        for step in steps(args.cpu, Path(tmp)):
            if args.only and step.name not in args.only:
                continue
            if (
                args.cpu
            ):  # the limits are the GPU machine's; a shared CPU runs even tiny steps slower
                step.limit_s *= CPU_SLOWER
            print(f"[{time.strftime('%H:%M:%S')}] {step.name} (limit {step.limit_s} s)", flush=True)
            result = run_step(step, out, Path(tmp))
            summary["steps"][step.name] = result
            print(f"    {result['status']} in {result['seconds']} s", flush=True)
            summary["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
            (out / "summary.json").write_text(json.dumps(summary, indent=2))
            (out / "summary.md").write_text(markdown(summary))
    print((out / "summary.md").read_text())
    failed = [name for name, result in summary["steps"].items() if result["status"] != "passed"]
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
