"""The fastest safe defaults for the device a run trains on: `trainer.precision`'s default."""

import torch

# Accelerator names that train on a CUDA GPU when there is one.
CUDA_ACCELERATORS = ("auto", "gpu", "cuda")


def best_precision(accelerator: str) -> str:
    """`trainer.precision: ${best_precision:${trainer.accelerator}}`.

    - bf16-mixed on a CUDA GPU with native bfloat16 (Ampere and later): float32's range, so no
      loss scaling, and tensor-core speed.
    - 16-mixed on Volta and Turing (compute capability 7.x), whose tensor cores have float16
      but no bfloat16; Lightning scales the loss so small gradients survive.
    - 32-true everywhere else: CPUs, Apple's MPS, and GPUs older than Volta, where float16 gains
      little or nothing and costs the loss scaler's risks.
    """
    if str(accelerator).lower() not in CUDA_ACCELERATORS or not torch.cuda.is_available():
        return "32-true"
    if torch.version.hip:  # the AMD GPUs ROCm builds of torch run on have bfloat16
        return "bf16-mixed"
    major, _minor = torch.cuda.get_device_capability()
    if major >= 8:  # native bfloat16 (torch.cuda.is_bf16_supported also counts emulated)
        return "bf16-mixed"
    return "16-mixed" if major >= 7 else "32-true"
