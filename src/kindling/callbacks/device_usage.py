"""Print the device table when a run starts (a multirun's first job alone: its jobs share the
machine), and the peak GPU memory when fit and test end."""

from typing import Any

import lightning as L
import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info
from rich.console import Console

from kindling.hardware import GIB, collect_device_info, device_table


class DeviceReport(Callback):
    """Rank 0 prints the device table once; on CUDA, each stage's peak memory allocated and
    reserved (what `nvidia-smi` counts), the busiest rank's, is printed and, with
    `log_peak_memory`, logged as `gpu/<stage>_peak_allocated_gib` and `..._reserved_gib`."""

    def __init__(self, log_peak_memory: bool = True):
        self.log_peak_memory = log_peak_memory
        self._printed = False

    def on_fit_start(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.is_global_zero and not self._printed and not _a_later_job():
            Console().print(device_table(collect_device_info()))
            self._printed = True
        if trainer.strategy.root_device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(trainer.strategy.root_device)

    on_test_start = on_fit_start

    def on_fit_end(self, trainer: L.Trainer, *args: Any) -> None:
        device, stage = trainer.strategy.root_device, trainer.state.fn.value  # "fit" or "test"
        if device.type != "cuda":
            return
        peaks = [torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device)]
        peaks = torch.tensor(peaks, dtype=torch.float64, device=device)
        # Every rank reaches this hook; the busiest GPU is the one that runs out first.
        allocated, reserved = (trainer.strategy.reduce(peaks, reduce_op="max") / GIB).tolist()
        total = torch.cuda.get_device_properties(device).total_memory / GIB
        rank_zero_info(
            f"Peak GPU memory in {stage} (busiest rank): {allocated:.2f} GiB allocated, "
            f"{reserved:.2f} GiB reserved, of {total:.1f} GiB."
        )
        if self.log_peak_memory:
            for logger in trainer.loggers:
                logger.log_metrics(
                    {f"gpu/{stage}_peak_allocated_gib": allocated,
                     f"gpu/{stage}_peak_reserved_gib": reserved},
                    step=trainer.global_step,
                )  # fmt: skip

    on_test_end = on_fit_end


def _a_later_job() -> bool:
    """A multirun's job after its first, which printed the table (under joblib too)."""
    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return False
    return (HydraConfig.get().job.get("num") or 0) > 0
