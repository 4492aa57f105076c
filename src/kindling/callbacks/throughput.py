"""Samples per second and model FLOPs utilisation (MFU), on Lightning's ThroughputMonitor."""

import itertools
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.throughput import Throughput, measure_flops
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.utilities import rank_zero_info
from torch.func import functional_call

from kindling.internals import require


def tensor_peaks(half: float, tf32: float, fp32: float) -> dict[torch.dtype | str, float]:
    """Peaks by dtype as Lightning keys them: bf16 and fp16 (equal), TF32 matmuls, plain fp32."""
    return {torch.bfloat16: half, torch.float16: half, "tfloat32": tf32, torch.float32: fp32}


# Dense peaks (FLOP/s) of cards Lightning 2.6's table does not name, or misreads: an L40S or L40
# taken for an L4, an H100 NVL given an NVL pair's sparse figure (Lightning-AI/pytorch-lightning
# #20660, #21677). NVIDIA's datasheets print tensor-core figures with 2:4 sparsity: halved here.
PEAK_FLOPS: dict[str, dict[torch.dtype | str, float]] = {
    # https://nvdam.widen.net/s/nb5zzzsjdf/hpc-datasheet-sc23-h200-datasheet-3002446 (SXM, NVL)
    "NVIDIA H200": tensor_peaks(989.5e12, 494.5e12, 67e12),
    "NVIDIA H200 NVL": tensor_peaks(835.5e12, 417.5e12, 60e12),
    # https://resources.nvidia.com/en-us-gpu-resources/h100-datasheet-24306 (NVL, one GPU)
    "NVIDIA H100 NVL": tensor_peaks(835.5e12, 417.5e12, 60e12),
    # https://www.nvidia.com/en-us/data-center/l40s/ and .../l40/
    "NVIDIA L40S": tensor_peaks(362.05e12, 183e12, 91.6e12),
    "NVIDIA L40": tensor_peaks(181.05e12, 90.5e12, 90.5e12),
    # https://www.nvidia.com/en-us/data-center/hgx/ (HGX B200, eight GPUs, over 8)
    "NVIDIA B200": tensor_peaks(2.25e15, 1.125e15, 75e12),
}


class ThroughputWithMFU(ThroughputMonitor):
    """Logs `train|validate/samples_per_sec`, `.../batches_per_sec` and, when the device's peak
    is known (`PEAK_FLOPS`, else Lightning's table), `.../mfu`. FLOPs per batch (forward +
    backward) are counted once on the meta device from the first batch's shape, unless the
    module has a `flops_per_batch`. It syncs the GPU every step: for measuring, not every run."""

    def __init__(self, window_size: int = 50, **kwargs: Any):
        super().__init__(batch_size_fn=self.batch_size, window_size=window_size, **kwargs)

    @staticmethod
    def batch_size(batch: Any) -> int:
        return len(batch[0] if isinstance(batch, list | tuple) else batch)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)  # Lightning's peak, from its own table
        device = trainer.strategy.root_device
        # The dtype matmuls run in, as Lightning reads it from the precision ("bf16-mixed", ...).
        kinds = {"bf16": torch.bfloat16, "16": torch.float16, "64": torch.float64}
        precision = trainer.precision
        dtype = next((t for p, t in kinds.items() if precision.startswith(p)), torch.float32)
        if dtype is torch.float32 and torch.get_float32_matmul_precision() != "highest":
            dtype = "tfloat32"
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else None
        if (peak := PEAK_FLOPS.get(name, {}).get(dtype)) is not None:
            set_available_flops(self, peak)
            tflops = f"{peak / 1e12:.1f} TFLOP/s"
            rank_zero_info(f"Peak of {name} at {dtype}: {tflops} (kindling's table)")
        if self.available_flops is None:
            rank_zero_info("Peak FLOPs of this device unknown: MFU is not logged.")

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: Any, batch: Any, *_: Any) -> None:
        if not hasattr(pl_module, "flops_per_batch"):
            pl_module.flops_per_batch = count_flops(pl_module, batch)
            rank_zero_info(f"FLOPs per batch (forward + backward): {pl_module.flops_per_batch:.3e}")


def count_flops(pl_module: L.LightningModule, batch: Any) -> int:
    """Forward + backward FLOPs of `pl_module` on a batch shaped like `batch`, run with meta
    tensors in place of its weights (`functional_call`): no weight is copied or computed with."""
    inputs = batch[0] if isinstance(batch, list | tuple) else batch
    weights = itertools.chain(pl_module.named_parameters(), pl_module.named_buffers())
    meta = {name: t.detach().to("meta").requires_grad_(t.requires_grad) for name, t in weights}
    meta_inputs = torch.empty(inputs.shape, dtype=inputs.dtype, device="meta")
    return measure_flops(
        pl_module, lambda: functional_call(pl_module, meta, meta_inputs), loss_fn=torch.Tensor.sum
    )


def set_available_flops(monitor: ThroughputMonitor, flops: float) -> None:
    """Have a set-up `monitor` compute MFU over a peak of `flops` FLOP/s (a private part of
    Lightning: its meters)."""
    meters = getattr(monitor, "_throughputs", None)
    meters_ok = isinstance(meters, dict) and all(isinstance(m, Throughput) for m in meters.values())
    require(meters_ok, "ThroughputMonitor._throughputs")
    monitor.available_flops = flops
    for meter in meters.values():
        meter.available_flops = flops
