"""Samples per second and model FLOPs utilisation (MFU), on Lightning's ThroughputMonitor."""

import copy
import itertools
from typing import Any

import lightning as L
import torch
from lightning.fabric.utilities.throughput import measure_flops
from lightning.pytorch.callbacks import ThroughputMonitor
from lightning.pytorch.utilities import rank_zero_info
from torch import nn


def batch_length(batch: Any) -> int:
    """The number of samples in a batch: the first dimension of its first tensor."""
    return len(batch[0] if isinstance(batch, list | tuple) else batch)


class ThroughputWithMFU(ThroughputMonitor):
    """Logs `train|validate/samples_per_sec`, `.../batches_per_sec` and, when the GPU's peak is
    known, `.../mfu` (model FLOPs per second over the peak).

    FLOPs per batch (forward + backward) are counted once on the meta device with
    `measure_flops`, from the shape of the first training batch, unless the LightningModule
    already has a `flops_per_batch`. The peak comes from Lightning's table of devices; on a
    device it does not list, samples/s are logged and MFU is not.

    The monitor synchronises the GPU every step to read its clock: turn it on to measure, not
    for every run.
    """

    def __init__(self, window_size: int = 50, **kwargs: Any):
        super().__init__(batch_size_fn=batch_length, window_size=window_size, **kwargs)

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        if self.available_flops is None:
            rank_zero_info("Peak FLOPs of this device unknown to Lightning: MFU is not logged.")

    def on_train_batch_start(
        self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if not hasattr(pl_module, "flops_per_batch"):
            pl_module.flops_per_batch = count_flops(pl_module, batch)
            rank_zero_info(f"FLOPs per batch (forward + backward): {pl_module.flops_per_batch:.3e}")


def count_flops(pl_module: L.LightningModule, batch: Any) -> int:
    """Forward + backward FLOPs of `pl_module` on a batch shaped like `batch` (meta tensors)."""
    inputs = batch[0] if isinstance(batch, list | tuple) else batch
    model = meta_copy(pl_module)  # shapes only: no memory, no compute
    meta_inputs = torch.empty(inputs.shape, dtype=inputs.dtype, device="meta")
    return measure_flops(model, lambda: model(meta_inputs), loss_fn=torch.Tensor.sum)


def meta_copy(module: nn.Module) -> nn.Module:
    """A copy of `module` whose parameters and buffers are on the meta device.

    The copy is made with meta tensors standing in for the weights from the start, so no
    weight is ever copied on the module's own device (a GPU may have no room for a second copy).
    """
    memo: dict[int, Any] = {}
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        meta = torch.empty_like(tensor.detach(), device="meta")
        if isinstance(tensor, nn.Parameter):
            meta = nn.Parameter(meta, requires_grad=tensor.requires_grad)
        memo[id(tensor)] = meta
    return copy.deepcopy(module, memo)
