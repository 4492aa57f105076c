"""Classification around any net that maps images `(B, C, H, W)`, or padded sequences `(B, T, F)`
and their lengths `(B,)`, to logits `(B, num_classes)`."""

from collections.abc import Sequence
from functools import partial
from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn
from torchmetrics import MaxMetric
from torchmetrics.classification import MulticlassAccuracy

from kindling.modules.base import BaseModule, OptimizerFactory, SchedulerFactory


class Classifier(BaseModule):
    """Cross-entropy classification with accuracy for train / val / test.

    A batch is `(images, labels)`, or `(sequences, lengths, labels)` (kindling.data.sequences):
    everything before the labels is the net's input.

    Logs `train/loss`, `train/acc`, `val/loss`, `val/acc`, `val/acc_best`, `test/loss`, `test/acc`,
    once per epoch (kindling.modules.base): no step waits on a host-device sync.

    Args:
        net: the model; num_classes: its output size.
        optimizer: a factory taking `params` (a Hydra `_partial_: true` config); scheduler: an
            optional factory taking `optimizer` (and `total_steps`, kindling.modules.optimization)
            stepped every `scheduler_interval`.
        compile: compile the net with `torch.compile` before fitting.
        compile_mode: `torch.compile` mode (`default`, `reduce-overhead`, `max-autotune`).
        channels_last: store conv weights and inputs as NHWC, the layout tensor cores read
            fastest (a CNN on a GPU, mostly with mixed precision).
        example_input_shape: the shape of one input (`[C, H, W]`). The model summary then runs
            one zero image through the net at the start of fit and shows each layer's input and
            output sizes and FLOPs (as torch's FlopCounterMode counts them: recurrent layers
            count 0). Left out of compiled runs, where it would cost a compilation of its own.
        backbone_lr_ratio: the backbone's learning rate as a share of the head's (the
            optimizer's `lr`): two parameter groups, `backbone` and `head` (the net's `head`
            submodule). 1: one group of every parameter.
        freeze_backbone_epochs: for this many first epochs only the head learns: the
            backbone's gradients are dropped before each optimizer step and its batch norms
            keep their statistics.
    """

    def __init__(
        self,
        net: nn.Module,
        num_classes: int,
        optimizer: OptimizerFactory,
        scheduler: SchedulerFactory | None = None,
        scheduler_interval: Literal["epoch", "step"] = "epoch",
        compile: bool = False,
        compile_mode: str | None = None,
        channels_last: bool = False,
        example_input_shape: Sequence[int] | None = None,
        backbone_lr_ratio: float = 1.0,
        freeze_backbone_epochs: int = 0,
    ):
        # No argument checks: they read the values on the host (a sync per step); predictions are
        # an argmax over num_classes logits, and cross-entropy already rejects bad targets.
        accuracy = partial(MulticlassAccuracy, num_classes, average="micro", validate_args=False)
        super().__init__(optimizer, scheduler, scheduler_interval, {"acc": accuracy})
        # Only plain values go into checkpoints; the net, optimizer and scheduler come from config.
        self.save_hyperparameters(ignore=["net", "optimizer", "scheduler"], logger=False)
        self.net = net
        # Saved in checkpoints (unlike the other metrics), so a resumed run keeps its best.
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)
        if example_input_shape is not None and not compile:
            self.example_input_array = torch.zeros(1, *example_input_shape)

    def forward(self, inputs: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        if lengths is not None:
            return self.net(inputs, lengths)
        if self.hparams.channels_last:
            inputs = inputs.contiguous(memory_format=torch.channels_last)
        return self.net(inputs)

    def setup(self, stage: str) -> None:
        # The model summary runs the example through this module directly, past the FSDP root
        # that wraps it; FSDP refuses a forward that enters a nested unit first ("Non-root FSDP
        # instance's `_is_root` should not have been set"), so sharded runs go without shapes.
        if self._trainer is not None and isinstance(self.trainer.strategy, FSDPStrategy):
            self.example_input_array = None
        if self.hparams.channels_last:
            self.net.to(memory_format=torch.channels_last)  # a layout change; no device move
        # Compile the net in place: its state_dict keys stay the same, so checkpoints of a
        # compiled run load into an uncompiled net and back.
        if self.hparams.compile and stage == "fit":
            self.net.compile(mode=self.hparams.compile_mode)

    def _backbone_frozen(self) -> bool:
        return self.current_epoch < self.hparams.freeze_backbone_epochs

    def on_train_epoch_start(self) -> None:
        if self.hparams.freeze_backbone_epochs:
            from kindling.modules.finetuning import hold_backbone  # fine-tuning runs only

            hold_backbone(self.net, frozen=self._backbone_frozen())

    def on_before_optimizer_step(self, optimizer: torch.optim.Optimizer) -> None:
        if self._backbone_frozen():
            from kindling.modules.finetuning import drop_backbone_gradients

            drop_backbone_gradients(self.net)

    def shared_step(self, stage: str, batch: tuple[torch.Tensor, ...]) -> dict[str, torch.Tensor]:
        *inputs, targets = batch
        logits = self(*inputs)
        losses = F.cross_entropy(logits, targets, reduction="none")
        preds = logits.argmax(dim=1)
        self.epoch_metrics[f"{stage}/loss"].update(losses)
        self.epoch_metrics[f"{stage}/acc"].update(preds, targets)
        # The predictions serve callbacks (the confusion matrix plot): no second forward pass.
        return {"loss": losses.mean(), "preds": preds, "targets": targets}

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        if self.trainer.sanity_checking:  # the check before training is not an epoch
            return
        # val/acc's compute() is already reduced across processes; MaxMetric keeps the best.
        self.val_acc_best(self.epoch_metrics["val/acc"].compute())
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True, prog_bar=True)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Class probabilities `(B, num_classes)`; a batch is images, or a tuple that starts with
        images `(B, C, H, W)`, or with padded sequences `(B, T, F)` and their lengths."""
        inputs = batch if isinstance(batch, list | tuple) else (batch,)
        return self(*inputs[: 2 if inputs[0].dim() == 3 else 1]).softmax(dim=-1)

    def configure_optimizers(self) -> dict[str, Any]:
        if self.hparams.backbone_lr_ratio == 1:
            return super().configure_optimizers()
        from kindling.modules.finetuning import parameter_groups

        return super().configure_optimizers(
            parameter_groups(self.net, self.hparams.backbone_lr_ratio)
        )
