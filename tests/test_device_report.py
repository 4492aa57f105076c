"""The device report: right on this machine, right for faked GPUs, and quiet about memory on CPU."""

import csv
import io
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import open_dict, read_write
from rich.console import Console

from kindling.device_report import print_device_report
from kindling.hardware import GIB, collect_device_info
from kindling.train import run

from helpers import QUIET, module_here

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def printed(width: int = 160) -> tuple[object, dict[str, str]]:
    """Print the report into a string; return what it collected and its rows as {key: value}."""
    out = io.StringIO()
    info = print_device_report(Console(file=out, width=width))
    rows = {}
    for line in out.getvalue().splitlines():
        # Keys and values are separated by the column gap: two or more spaces.
        parts = re.split(r"\s{2,}", line.strip(), maxsplit=1)
        if len(parts) == 2:
            rows[parts[0]] = parts[1]
    return info, rows


@pytest.fixture
def two_fake_gpus(monkeypatch) -> None:
    names = ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"]
    totals = [80 * GIB, 40 * GIB]
    cuda = torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "device_count", lambda: 2)
    capabilities = [(9, 0), (8, 0)]
    monkeypatch.setattr(
        cuda,
        "get_device_properties",
        lambda i: SimpleNamespace(
            name=names[i],
            major=capabilities[i][0],
            minor=capabilities[i][1],
            total_memory=totals[i],
        ),
    )
    monkeypatch.setattr(cuda, "memory_allocated", lambda i: [3 * GIB, 0][i])
    monkeypatch.setattr(cuda, "memory_reserved", lambda i: [4 * GIB, 0][i])
    monkeypatch.setattr(torch.backends.cudnn, "version", lambda: 91002)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,3")


@pytest.mark.skipif(torch.cuda.is_available(), reason="describes a machine without CUDA")
def test_report_on_a_machine_without_gpus(monkeypatch) -> None:
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    info, rows = printed()
    assert info.cuda_available is False and info.gpus == []
    assert info.recommended_trainer == "cpu"
    assert rows["torch"] == torch.__version__
    assert rows["CUDA available"] == "no"
    assert rows["GPUs"] == "0"
    assert rows["CUDA_VISIBLE_DEVICES"] == "not set (all)"
    assert rows["fits this machine"] == "trainer=cpu"
    assert not any(key.startswith("cuda:") for key in rows)


def test_report_lists_two_gpus_and_recommends_ddp(two_fake_gpus) -> None:
    info, rows = printed()
    assert [gpu.name for gpu in info.gpus] == ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB"]
    assert info.recommended_trainer == "ddp"
    assert info.recommended_overrides == "trainer=ddp"
    assert rows["CUDA available"] == "yes"
    assert rows["GPUs"] == "2"
    assert rows["cuda:0"] == (
        "NVIDIA H100 80GB HBM3 · sm_90 · 80.0 GiB total · 3.0 GiB allocated · 4.0 GiB reserved"
    )
    assert rows["cuda:1"] == (
        "NVIDIA A100-SXM4-40GB · sm_80 · 40.0 GiB total · 0.0 GiB allocated · 0.0 GiB reserved"
    )
    assert rows["CUDA_VISIBLE_DEVICES"] == "'0,3'"
    assert rows["cuDNN"] == "91002"
    assert rows["fits this machine"] == "trainer=ddp"


def test_recommendation_follows_the_hardware(two_fake_gpus, monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda i: SimpleNamespace(name="GPU", major=8, minor=9, total_memory=GIB),
    )
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: 0)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 0)
    assert collect_device_info().recommended_overrides == "trainer=ddp"  # it takes all 4
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    assert collect_device_info().recommended_overrides == "trainer=gpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    assert collect_device_info().recommended_overrides == "trainer=mps"


@pytest.mark.slow
def test_command_prints_the_report(tmp_path: Path) -> None:
    result = module_here("kindling.device_report", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "CUDA available" in result.stdout and "fits this machine      trainer=" in result.stdout


def test_callback_prints_the_table_once_and_survives_the_cpu(compose_config, capsys) -> None:
    run(compose_config("debug=limit", "trainer=cpu", *QUIET))
    out = capsys.readouterr().out
    # Printed at the start of fit, not again at the start of test.
    assert out.count("CUDA_VISIBLE_DEVICES") == 1
    assert "Peak GPU memory" not in out


@pytest.mark.parametrize(("job", "printed"), [(0, 1), (1, 0)])
def test_a_multiruns_first_job_alone_prints_the_table(compose_config, capsys, job, printed) -> None:
    cfg = compose_config("debug=fdr", "trainer=cpu", *QUIET)
    hydra = HydraConfig.get()
    with read_write(hydra), open_dict(hydra):
        hydra.mode, hydra.job.num = RunMode.MULTIRUN, job
    run(cfg)
    assert capsys.readouterr().out.count("CUDA_VISIBLE_DEVICES") == printed


@pytest.mark.gpu
@needs_cuda
def test_callback_reports_peak_gpu_memory(compose_config, tmp_path, caplog) -> None:
    run(compose_config("debug=limit", "trainer=gpu", *QUIET))
    assert "Peak GPU memory in fit" in caplog.text and "Peak GPU memory in test" in caplog.text
    with open(tmp_path / "run" / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    allocated = [
        float(r["gpu/fit_peak_allocated_gib"]) for r in rows if r.get("gpu/fit_peak_allocated_gib")
    ]
    reserved = [
        float(r["gpu/fit_peak_reserved_gib"]) for r in rows if r.get("gpu/fit_peak_reserved_gib")
    ]
    # The CNN's weights, gradients and Adam state alone take memory; the allocator reserves more.
    assert len(allocated) == 1 and 0 < allocated[0] <= reserved[0]
