"""Classification around any net that maps images `(B, C, H, W)`, or padded sequences `(B, T, F)`
and their lengths `(B,)`, to logits `(B, num_classes)`."""

from collections.abc import Sequence
from typing import Any

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn
from torchmetrics import MaxMetric

from kindling.modules.metrics import accuracy, log_epoch_metrics, running_mean
from kindling.modules.optimization import OptimizerFactory, SchedulerFactory, configure_optimizers


class Classifier(L.LightningModule):
    """Cross-entropy classification with accuracy for train / val / test.

    A batch is `(images, labels)`, or `(sequences, lengths, labels)` (kindling.data.sequences):
    everything before the labels is the net's input.

    Logs `train/loss`, `train/acc`, `val/loss`, `val/acc`, `val/acc_best`, `test/loss`, `test/acc`.
    Losses and accuracies are torchmetrics objects: steps update them on the device, and they are
    logged (reduced across processes) once per epoch, so no step waits on a host-device sync.
    The loss metrics take every sample's loss: an epoch's loss is the mean over its samples, the
    same however the split is cut into batches and processes.

    Args:
        net: the model; its output size sets the number of classes.
        num_classes: number of classes (for the accuracy metrics).
        optimizer: a factory taking `params` (a Hydra `_partial_: true` config).
        scheduler: an optional factory taking `optimizer`, and `total_steps` (the run's
            optimizer steps) if it has that argument, e.g.
            `kindling.modules.optimization.warmup_cosine`.
        scheduler_interval: step the scheduler every `"epoch"` or every `"step"`.
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
        scheduler_interval: str = "epoch",
        compile: bool = False,
        compile_mode: str | None = None,
        channels_last: bool = False,
        example_input_shape: Sequence[int] | None = None,
        backbone_lr_ratio: float = 1.0,
        freeze_backbone_epochs: int = 0,
    ):
        super().__init__()
        # Only plain values go into checkpoints; the net, optimizer and scheduler come from config.
        self.save_hyperparameters(ignore=["net", "optimizer", "scheduler"], logger=False)
        self.net = net
        self.optimizer_factory = optimizer
        self.scheduler_factory = scheduler

        self.train_acc, self.val_acc, self.test_acc = (accuracy(num_classes) for _ in range(3))
        self.train_loss, self.val_loss, self.test_loss = (running_mean() for _ in range(3))
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

    def _shared_step(
        self, batch: tuple[torch.Tensor, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Each sample's loss (the epoch metrics average samples), the predictions, the targets."""
        *inputs, targets = batch
        logits = self(*inputs)
        losses = F.cross_entropy(logits, targets, reduction="none")
        return losses, logits.argmax(dim=1), targets

    def training_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> torch.Tensor:
        losses, preds, targets = self._shared_step(batch)
        self.train_loss.update(losses)
        self.train_acc.update(preds, targets)
        return losses.mean()

    def on_train_epoch_end(self) -> None:
        log_epoch_metrics(self, {"train/loss": self.train_loss, "train/acc": self.train_acc})

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        losses, preds, targets = self._shared_step(batch)
        self.val_loss.update(losses)
        self.val_acc.update(preds, targets)

    def on_validation_epoch_end(self) -> None:
        log_epoch_metrics(self, {"val/loss": self.val_loss, "val/acc": self.val_acc})
        # The sanity check before training is not an epoch.
        if self.trainer.sanity_checking:
            return
        # val_acc.compute() is already reduced across processes; MaxMetric keeps the best epoch.
        self.val_acc_best(self.val_acc.compute())
        self.log("val/acc_best", self.val_acc_best.compute(), sync_dist=True, prog_bar=True)

    def test_step(
        self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int
    ) -> dict[str, torch.Tensor]:
        losses, preds, targets = self._shared_step(batch)
        self.test_loss.update(losses)
        self.test_acc.update(preds, targets)
        # For callbacks (the confusion matrix plot): no second forward pass.
        return {"preds": preds, "targets": targets}

    def on_test_epoch_end(self) -> None:
        metrics = {"test/loss": self.test_loss, "test/acc": self.test_acc}
        log_epoch_metrics(self, metrics, prog_bar=False)

    def predict_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        """Class probabilities `(B, num_classes)`; a batch is images, or a tuple that starts with
        images `(B, C, H, W)`, or with padded sequences `(B, T, F)` and their lengths."""
        if not isinstance(batch, list | tuple):
            return self(batch).softmax(dim=-1)
        if batch[0].dim() == 3:
            return self(batch[0], batch[1]).softmax(dim=-1)
        return self(batch[0]).softmax(dim=-1)

    def configure_optimizers(self) -> dict[str, Any]:
        ratio = self.hparams.backbone_lr_ratio
        # One group of the parameters the strategy trains (FSDP's flat ones) unless the
        # backbone learns at its own rate.
        params = self.trainer.model.parameters()
        if ratio != 1:
            from kindling.modules.finetuning import parameter_groups

            params = parameter_groups(self.net, ratio)
        return configure_optimizers(
            self.optimizer_factory,
            self.scheduler_factory,
            params,
            self.trainer,
            interval=self.hparams.scheduler_interval,
        )
