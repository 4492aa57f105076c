"""What this machine offers for training: torch and CUDA versions, GPUs, their memory, the
`trainer=` option that fits it (`python -m kindling.device_report` prints it; so does the
`DeviceReport` callback at the start of every fit), and the fastest safe precision for it."""

import os
from dataclasses import dataclass, field

import pynvml
import torch
from lightning.fabric.accelerators.cuda import is_cuda_available
from rich import box
from rich.console import Console
from rich.table import Table

GIB = 1024**3


@dataclass
class GPU:
    """One CUDA device as torch sees it (indices count only the visible devices)."""

    index: int
    name: str
    capability: tuple[int, int]
    total_bytes: int
    allocated_bytes: int  # held by tensors of this process
    reserved_bytes: int  # held by this process's caching allocator (>= allocated)


@dataclass
class DeviceInfo:
    torch_version: str
    cuda_build: str | None  # CUDA version torch was built with; None for a CPU-only build
    cudnn_version: int | None
    cuda_available: bool
    cuda_visible_devices: str | None  # None: the variable is not set, so every GPU is visible
    mps_available: bool
    gpus: list[GPU] = field(default_factory=list)

    @property
    def recommended_trainer(self) -> str:
        """The `trainer=` config option for this machine: ddp, gpu, mps or cpu."""
        if len(self.gpus) > 1:
            return "ddp"
        if self.gpus:
            return "gpu"
        if self.mps_available:
            return "mps"
        return "cpu"

    @property
    def recommended_overrides(self) -> str:
        """The command-line overrides that use every GPU (trainer=ddp takes them all)."""
        return f"trainer={self.recommended_trainer}"


def collect_device_info() -> DeviceInfo:
    """Ask torch about this machine. Reads memory counters only where CUDA is initialised already,
    so a report never creates a CUDA context of its own."""
    # Looked up on torch.cuda at call time (not imported by name) so tests can fake GPUs.
    cuda = torch.cuda
    available = cuda.is_available()
    gpus = []
    for index in range(cuda.device_count() if available else 0):
        total = cuda.get_device_properties(index).total_memory
        gpus.append(
            GPU(
                index=index,
                name=cuda.get_device_name(index),
                capability=tuple(cuda.get_device_capability(index)),
                total_bytes=total,
                allocated_bytes=cuda.memory_allocated(index),
                reserved_bytes=cuda.memory_reserved(index),
            )
        )
    return DeviceInfo(
        torch_version=torch.__version__,
        cuda_build=torch.version.cuda,
        cudnn_version=torch.backends.cudnn.version() if available else None,
        cuda_available=available,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        mps_available=torch.backends.mps.is_available(),
        gpus=gpus,
    )


def _gib(n_bytes: int) -> str:
    return f"{n_bytes / GIB:.1f} GiB"


def device_table(info: DeviceInfo) -> Table:
    """A compact two-column table: one row per fact, one row per GPU."""
    table = Table(box=box.SIMPLE, show_header=False, pad_edge=False, title="Devices")
    table.add_column(style="bold")
    table.add_column()
    table.add_row("torch", info.torch_version)
    table.add_row("CUDA build", info.cuda_build or "none (CPU-only torch)")
    if info.cudnn_version is not None:
        table.add_row("cuDNN", str(info.cudnn_version))
    table.add_row("CUDA available", "yes" if info.cuda_available else "no")
    table.add_row("GPUs", str(len(info.gpus)))
    for gpu in info.gpus:
        major, minor = gpu.capability
        table.add_row(
            f"cuda:{gpu.index}",
            f"{gpu.name} · sm_{major}{minor} · {_gib(gpu.total_bytes)} total · "
            f"{_gib(gpu.allocated_bytes)} allocated · {_gib(gpu.reserved_bytes)} reserved",
        )
    visible = info.cuda_visible_devices
    table.add_row("CUDA_VISIBLE_DEVICES", "not set (all)" if visible is None else repr(visible))
    table.add_row("MPS available", "yes" if info.mps_available else "no")
    table.add_row("use", f"python train.py {info.recommended_overrides}")
    return table


def print_device_report(console: Console | None = None) -> DeviceInfo:
    """Print the device table and return what it shows."""
    info = collect_device_info()
    (console or Console()).print(device_table(info))
    return info


# Accelerator names that train on a CUDA GPU when there is one.
CUDA_ACCELERATORS = ("auto", "gpu", "cuda")


def best_precision(accelerator: str) -> str:
    """The fastest safe precision for `accelerator` on this machine: what `trainer.precision:
    null` trains in (kindling.train.build_trainer) and what kindling.predict uses.

    - bf16-mixed on a CUDA GPU with native bfloat16 (Ampere and later): float32's range, so no
      loss scaling, and tensor-core speed.
    - 16-mixed on Volta and Turing (compute capability 7.x), whose tensor cores have float16
      but no bfloat16; Lightning scales the loss so small gradients survive.
    - 32-true everywhere else: CPUs, Apple's MPS, and GPUs older than Volta, where float16 gains
      little or nothing and costs the loss scaler's risks.

    Of several visible GPUs, the oldest decides. No CUDA context is created here (see
    `cuda_capabilities`).
    """
    # Lightning's check counts the GPUs through NVML (PYTORCH_NVML_BASED_CUDA_CHECK), not CUDA.
    if str(accelerator).lower() not in CUDA_ACCELERATORS or not is_cuda_available():
        return "32-true"
    if torch.version.hip:  # the AMD GPUs ROCm builds of torch run on have bfloat16
        return "bf16-mixed"
    major = min(major for major, _minor in cuda_capabilities())
    if major >= 8:  # native bfloat16 (torch.cuda.is_bf16_supported also counts emulated)
        return "bf16-mixed"
    return "16-mixed" if major >= 7 else "32-true"


def cuda_capabilities() -> list[tuple[int, int]]:
    """The compute capability of each visible GPU, read through NVML.

    torch.cuda.get_device_capability would create a CUDA context in this process, after which
    a forked one cannot use CUDA (strategy=ddp_fork, ddp_notebook). Where NVML cannot answer (no
    NVML, as on Jetson; a MIG device or a shortened UUID in CUDA_VISIBLE_DEVICES), torch does.
    """
    try:
        pynvml.nvmlInit()
        try:
            return [
                tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle))
                for handle in _visible_nvml_devices()
            ]
        finally:
            pynvml.nvmlShutdown()
    except pynvml.NVMLError:
        return [tuple(torch.cuda.get_device_capability())]


def _visible_nvml_devices() -> list:
    """NVML's handles of the GPUs CUDA_VISIBLE_DEVICES lets CUDA see (indices or UUIDs)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    names = [name.strip() for name in visible.split(",") if name.strip()]
    return [
        pynvml.nvmlDeviceGetHandleByIndex(int(name))
        if name.isdigit()
        else pynvml.nvmlDeviceGetHandleByUUID(name)
        for name in names
    ]
