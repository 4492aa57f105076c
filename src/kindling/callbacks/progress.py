"""Rich's progress bar, with a per-step cost bounded by its refresh rate."""

import time
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import RichProgressBar
from lightning.pytorch.callbacks.progress.rich_progress import RichProgressBarTheme


class ThrottledRichProgressBar(RichProgressBar):
    """Lightning's `RichProgressBar` updates its bar and reads every metric at each batch (its
    `refresh_rate` is only how often rich redraws, per second): on a small net, more host time
    than the step. This one passes a batch on at most `refresh_rate` times a second, and always
    a loop's last: the same bar, for a clock read per step (none on ranks that draw no bar)."""

    def __init__(
        self,
        refresh_rate: int = 10,
        leave: bool = False,
        theme: RichProgressBarTheme | None = None,
        console_kwargs: dict[str, Any] | None = None,
    ):
        super().__init__(refresh_rate, leave, theme or RichProgressBarTheme(), console_kwargs)
        self._next_update = 0.0

    def _due(self, batch_idx: int, batches: int | float) -> bool:
        now = time.monotonic()
        if now < self._next_update and batch_idx + 1 < batches:
            return False
        self._next_update = now + 1 / max(self.refresh_rate, 1)
        return True

    def on_train_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.is_enabled and self._due(batch_idx, self.total_train_batches):
            super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)

    def on_validation_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        if self.is_enabled and self._due(batch_idx, self.total_val_batches_current_dataloader):
            super().on_validation_batch_end(
                trainer, pl_module, outputs, batch, batch_idx, dataloader_idx
            )

    def on_test_batch_end(
        self, trainer: L.Trainer, pl_module: Any, outputs: Any, batch: Any, batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:  # fmt: skip
        if self.is_enabled and self._due(batch_idx, self.total_test_batches_current_dataloader):
            super().on_test_batch_end(trainer, pl_module, outputs, batch, batch_idx, dataloader_idx)
