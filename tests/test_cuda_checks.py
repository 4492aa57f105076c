"""torch's CUDA check stays cheap where there is no GPU (it runs at every optimizer step)."""

import os

import lightning  # noqa: F401 - sets PYTORCH_NVML_BASED_CUDA_CHECK=1, as in every kindling run
import pytest
import torch
from torch import nn

from kindling.utils.cuda import NVML_CHECK, use_plain_cuda_check_without_gpu


def nvml_loads_per_step(monkeypatch, steps: int = 3) -> int:
    loads = []
    original = torch.cuda._raw_device_count_nvml

    def counted() -> int:
        loads.append(1)
        return original()

    monkeypatch.setattr(torch.cuda, "_raw_device_count_nvml", counted)
    net = nn.Linear(2, 2)
    optimizer = torch.optim.AdamW(net.parameters())
    for _ in range(steps):
        net(torch.randn(4, 2)).sum().backward()
        optimizer.step()
    return len(loads)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the NVML check stays on")
def test_optimizer_steps_stop_loading_nvml_without_a_gpu(monkeypatch) -> None:
    monkeypatch.setenv(NVML_CHECK, "1")
    assert nvml_loads_per_step(monkeypatch) == 3  # Lightning's setting: one load per step
    use_plain_cuda_check_without_gpu()
    assert nvml_loads_per_step(monkeypatch) == 0
    assert not torch.cuda.is_available()


def test_the_nvml_check_is_kept_when_asked_for_with_a_gpu(monkeypatch) -> None:
    monkeypatch.setenv(NVML_CHECK, "1")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    use_plain_cuda_check_without_gpu()
    assert os.environ[NVML_CHECK] == "1"
