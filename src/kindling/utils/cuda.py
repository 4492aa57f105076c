"""CUDA availability checks that stay cheap on a machine without a GPU."""

import os

import torch

NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"


def use_plain_cuda_check_without_gpu() -> None:
    """Stop torch from loading NVML at every optimizer step where there is no GPU.

    Importing Lightning sets `PYTORCH_NVML_BASED_CUDA_CHECK=1`, so that asking whether CUDA is
    available never initialises it in a process that may fork workers. `torch.optim` asks at
    every step, and with no GPU the NVML answer is never cached: each step loads
    libnvidia-ml again (0.2-0.4 ms on a CPU, a few percent of a small model's step). With no
    GPU there is nothing to keep fork-safe, so torch's own cached check is used instead.
    """
    if os.environ.get(NVML_CHECK) == "1" and not torch.cuda.is_available():
        del os.environ[NVML_CHECK]
