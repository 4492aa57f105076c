"""What this machine offers for training: the device table (`python -m kindling.device_report`),
the `trainer=` option that fits it, and the fastest safe precision."""

import os
from dataclasses import dataclass, field

import pynvml
import torch
from lightning.fabric.accelerators.cuda import is_cuda_available
from rich import box
from rich.table import Table

GIB = 1024**3


@dataclass
class DeviceInfo:
    cuda_available: bool
    mps_available: bool
    gpus: list = field(default_factory=list)  # each visible GPU's torch.cuda.get_device_properties

    @property
    def recommended_trainer(self) -> str:
        if self.gpus:
            return "ddp" if len(self.gpus) > 1 else "gpu"  # trainer=ddp takes every GPU
        return "mps" if self.mps_available else "cpu"

    @property
    def recommended_overrides(self) -> str:
        return f"trainer={self.recommended_trainer}"


def collect_device_info() -> DeviceInfo:
    cuda = torch.cuda  # looked up at call time: tests fake GPUs
    available = cuda.is_available()
    gpus = [cuda.get_device_properties(i) for i in range(cuda.device_count() if available else 0)]
    return DeviceInfo(available, torch.backends.mps.is_available(), gpus)


def device_table(info: DeviceInfo) -> Table:
    """Two columns: one row per fact, one row per GPU."""
    table = Table(box=box.SIMPLE, show_header=False, pad_edge=False, title="Devices")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("torch", torch.__version__)
    table.add_row("CUDA build", torch.version.cuda or "none (CPU-only torch)")
    if info.cuda_available:
        table.add_row("cuDNN", str(torch.backends.cudnn.version()))
    table.add_row("CUDA available", "yes" if info.cuda_available else "no")
    table.add_row("GPUs", str(len(info.gpus)))
    for i, gpu in enumerate(info.gpus):  # memory: this process's tensors, its caching allocator
        allocated, reserved = torch.cuda.memory_allocated(i), torch.cuda.memory_reserved(i)
        table.add_row(
            f"cuda:{i}",
            f"{gpu.name} · sm_{gpu.major}{gpu.minor} · {gpu.total_memory / GIB:.1f} GiB total · "
            f"{allocated / GIB:.1f} GiB allocated · {reserved / GIB:.1f} GiB reserved",
        )
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    table.add_row("CUDA_VISIBLE_DEVICES", "not set (all)" if visible is None else repr(visible))
    table.add_row("MPS available", "yes" if info.mps_available else "no")
    table.add_row("fits this machine", info.recommended_overrides)  # what it found, not an order
    return table


def best_precision(accelerator: str) -> str:
    """What `trainer.precision: null` trains in: bf16-mixed on GPUs with native bfloat16 (Ampere
    on, ROCm), 16-mixed on Volta and Turing, 32-true elsewhere. Of several GPUs the oldest
    decides."""
    # Lightning counts the GPUs through NVML: no CUDA context, so strategy=ddp_fork can fork.
    if str(accelerator).lower() not in ("auto", "gpu", "cuda") or not is_cuda_available():
        return "32-true"
    if torch.version.hip:
        return "bf16-mixed"
    # Each visible GPU's capability through NVML (a CUDA context would keep ddp_fork from
    # forking); where NVML cannot answer (Jetson, MIG), through torch.
    try:
        pynvml.nvmlInit()
        try:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            names = range(pynvml.nvmlDeviceGetCount()) if visible is None else visible.split(",")
            names = [str(name).strip() for name in names if str(name).strip()]
            handles = [  # CUDA_VISIBLE_DEVICES names each GPU by its index or its UUID
                pynvml.nvmlDeviceGetHandleByIndex(int(name)) if name.isdigit()
                else pynvml.nvmlDeviceGetHandleByUUID(name)
                for name in names
            ]  # fmt: skip
            major = min(pynvml.nvmlDeviceGetCudaComputeCapability(h)[0] for h in handles)
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        major = torch.cuda.get_device_capability()[0]
    # Native bfloat16 from 8 on (torch.cuda.is_bf16_supported also counts emulated).
    return "bf16-mixed" if major >= 8 else "16-mixed" if major >= 7 else "32-true"
