"""Classification around any net that maps images `(B, C, H, W)`, or padded sequences `(B, T, F)`
and their lengths `(B,)`, to logits `(B, num_classes)`."""

from collections.abc import Sequence
from functools import partial
from typing import Any

import torch
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn
from torchmetrics import MaxMetric
from torchmetrics.classification import MulticlassAccuracy

from kindling.modules.base import BaseModule


class Classifier(BaseModule):
    """Cross-entropy classification of `(images, labels)` or `(sequences, lengths, labels)`
    batches; logs `<stage>/loss`, `<stage>/acc` and `val/acc_best`. `channels_last`: NHWC, the
    layout tensor cores read fastest. `example_input_shape` (`[C, H, W]`): the model summary
    shows each layer's sizes and FLOPs. `backbone_lr_ratio`, `freeze_backbone_epochs`: the
    backbone's learning rate as a share of the head's, epochs only the head learns
    (kindling.modules.finetuning). The optimizer, scheduler and compilation: `BaseModule`'s."""

    def __init__(
        self,
        net: nn.Module,
        num_classes: int,
        channels_last: bool = False,
        example_input_shape: Sequence[int] | None = None,
        backbone_lr_ratio: float = 1.0,
        freeze_backbone_epochs: int = 0,
        **kwargs: Any,
    ):
        # No argument checks: they read the values on the host (a sync per step); predictions are
        # an argmax over num_classes logits, and cross-entropy already rejects bad targets.
        accuracy = partial(MulticlassAccuracy, num_classes, average="micro", validate_args=False)
        super().__init__(metrics={"acc": accuracy}, **kwargs)
        self.net = net
        # Saved in checkpoints (unlike the other metrics), so a resumed run keeps its best.
        self.val_acc_best = MaxMetric()
        self.val_acc_best.persistent(True)
        if example_input_shape is not None and not self.hparams.compile:
            self.example_input_array = torch.zeros(1, *example_input_shape)

    def forward(self, inputs: torch.Tensor, lengths: torch.Tensor | None = None) -> torch.Tensor:
        # A channels_last net needs no NHWC inputs: a convolution computes in its weight's layout.
        return self.net(inputs) if lengths is None else self.net(inputs, lengths)

    def setup(self, stage: str) -> None:
        # The summary runs the example past the FSDP root, which FSDP refuses ("Non-root FSDP
        # instance's `_is_root` should not have been set"): sharded runs go without shapes.
        if self._trainer is not None and isinstance(self.trainer.strategy, FSDPStrategy):
            self.example_input_array = None
        if self.hparams.channels_last:
            self.net.to(memory_format=torch.channels_last)  # a layout change; no device move

    def configure_callbacks(self) -> list[Callback]:
        if not self.hparams.freeze_backbone_epochs:
            return []
        from kindling.modules.finetuning import FrozenBackbone  # fine-tuning runs only

        return [FrozenBackbone(self.hparams.freeze_backbone_epochs)]

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
        if not self.trainer.sanity_checking:  # the check before training is not an epoch
            # val/acc's compute() is already reduced across processes; MaxMetric keeps the best.
            self.val_acc_best(self.epoch_metrics["val/acc"].compute())
            self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True, prog_bar=True)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Class probabilities `(B, num_classes)` of images, or of a tuple that starts with images
        or with padded sequences and their lengths."""
        inputs = batch if isinstance(batch, list | tuple) else (batch,)
        return self(*inputs[: 2 if inputs[0].dim() == 3 else 1]).softmax(dim=-1)

    def configure_optimizers(self) -> dict[str, Any]:
        if self.hparams.backbone_lr_ratio == 1:
            return super().configure_optimizers()
        from kindling.modules.finetuning import parameter_groups

        return super().configure_optimizers(
            parameter_groups(self.net, self.hparams.backbone_lr_ratio)
        )
