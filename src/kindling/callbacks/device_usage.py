"""Print the device table when a run starts, and the peak GPU memory when fit and test end."""

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from rich.console import Console

from kindling.hardware import GIB, collect_device_info, device_table


class DeviceReport(Callback):
    """Show what the run has to work with, and what it used.

    At the start of the first stage (fit, or test alone) rank 0 prints the device table of
    `python -m kindling.device_report`. On CUDA, each stage's peak memory allocated (by tensors)
    and reserved (by PyTorch's caching allocator, what `nvidia-smi` counts) is printed, as the
    maximum over ranks, and sent to the loggers as `gpu/<stage>_peak_allocated_gib` and
    `gpu/<stage>_peak_reserved_gib`. On other devices the memory report is skipped.
    """

    def __init__(self, log_peak_memory: bool = True):
        self.log_peak_memory = log_peak_memory
        self._printed = False

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start(trainer)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._start(trainer)

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._report_peak(trainer, "fit")

    def on_test_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._report_peak(trainer, "test")

    def _start(self, trainer: L.Trainer) -> None:
        if trainer.is_global_zero and not self._printed:
            Console().print(device_table(collect_device_info()))
            self._printed = True
        device = trainer.strategy.root_device
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)

    def _report_peak(self, trainer: L.Trainer, stage: str) -> None:
        device = trainer.strategy.root_device
        if device.type != "cuda":
            return
        peaks = torch.tensor(
            [torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)],
            dtype=torch.float64,
            device=device,
        )
        # Every rank reaches this hook, so the collective cannot hang; the busiest GPU is the one
        # that runs out of memory first.
        allocated, reserved = (trainer.strategy.reduce(peaks, reduce_op="max") / GIB).tolist()
        total = torch.cuda.get_device_properties(device).total_memory / GIB
        rank_zero_info(
            f"Peak GPU memory in {stage} (busiest rank): {allocated:.2f} GiB allocated, "
            f"{reserved:.2f} GiB reserved, of {total:.1f} GiB."
        )
        if self.log_peak_memory:
            for logger in trainer.loggers:  # loggers write on rank 0 only
                logger.log_metrics(
                    {
                        f"gpu/{stage}_peak_allocated_gib": allocated,
                        f"gpu/{stage}_peak_reserved_gib": reserved,
                    },
                    step=trainer.global_step,
                )
