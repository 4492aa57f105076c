"""Where a training step's fixed cost goes: a net so small that almost nothing else is timed.

    python benchmarks/step_floor.py --repeats 8

Each of the first four rows adds one layer to the row above it; every row times the training
steps of an epoch (first epoch of each run excluded), all in one process, rows in turn,
`--repeats` rounds:

- plain: forward, cross-entropy, backward, AdamW step in a hand-written loop;
- Lightning: the same net in a minimal LightningModule, Trainer with no callbacks or logger;
- + kindling's Classifier: its metric updates (loss and accuracy, logged once per epoch);
- + kindling's callbacks and CSV logger: what `python train.py` adds by default;
- for comparison, the Classifier calling `self.log(<metric>, on_epoch=True)` in every step
  instead (the pattern many templates use), no callbacks.

The differences between rows are the per-step cost of each layer on this machine; a model whose
step takes S ms pays them as a fraction 1/S of its epoch.
"""

import argparse
import functools
import statistics
import tempfile
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from overhead import BareModule, compose_kindling, cpu_name
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kindling.modules import Classifier
from kindling.utils import instantiate_group
from kindling.utils.cuda import use_plain_cuda_check_without_gpu

STEPS, BATCH, EPOCHS = 150, 128, 4
SCRATCH = tempfile.TemporaryDirectory(prefix="kindling-step-floor-")  # logs and checkpoints


def tiny_net() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))


class ClassifierLoggingEveryStep(Classifier):
    def training_step(self, batch, batch_idx):
        loss, preds, targets = self._shared_step(batch)
        self.train_loss(loss)
        self.train_acc(preds, targets)
        self.log("train/loss", self.train_loss, on_step=False, on_epoch=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True)
        return loss

    def on_train_epoch_end(self) -> None:
        pass  # logged in the steps


class TrainingTimer(L.Callback):
    def __init__(self) -> None:
        self.times: list[float] = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._start = time.perf_counter()

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.times.append(time.perf_counter() - self._start)


def data() -> tuple[DataLoader, DataLoader]:
    images, labels = torch.randn(STEPS * BATCH, 1, 8, 8), torch.randint(0, 10, (STEPS * BATCH,))
    train = DataLoader(TensorDataset(images, labels), batch_size=BATCH, shuffle=True)
    return train, DataLoader(TensorDataset(images[:256], labels[:256]), batch_size=BATCH)


def time_plain() -> list[float]:
    net, (train, _) = tiny_net(), data()
    optimizer = torch.optim.AdamW(net.parameters())
    times = []
    for _ in range(EPOCHS):
        start = time.perf_counter()
        for images, targets in train:
            loss = F.cross_entropy(net(images), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        times.append(time.perf_counter() - start)
    return times


def time_lightning(module: L.LightningModule, kindling_defaults: bool) -> list[float]:
    timer = TrainingTimer()
    callbacks, logger = [timer], False
    bare = {"enable_checkpointing": False, "enable_progress_bar": False}
    if kindling_defaults:
        cfg = compose_kindling("cnn", "cpu", EPOCHS, Path(SCRATCH.name))
        callbacks += instantiate_group(cfg.callbacks, "callbacks")
        logger, bare = instantiate_group(cfg.logger, "logger"), {}
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=EPOCHS, logger=logger, callbacks=callbacks,
        num_sanity_val_steps=0, enable_model_summary=False, **bare,
    )  # fmt: skip
    trainer.fit(module, *data())
    return timer.times


def classifier(module_class: type[Classifier] = Classifier) -> Classifier:
    return module_class(
        net=tiny_net(), num_classes=10, optimizer=functools.partial(torch.optim.AdamW)
    )


ROWS = {
    "plain loop": time_plain,
    "Lightning, minimal module": lambda: time_lightning(
        BareModule(tiny_net(), functools.partial(torch.optim.AdamW)), False
    ),
    "+ kindling's Classifier": lambda: time_lightning(classifier(), False),
    "+ kindling's callbacks and CSV logger": lambda: time_lightning(classifier(), True),
    "Classifier logging its metrics every step": lambda: time_lightning(
        classifier(ClassifierLoggingEveryStep), False
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8)
    args = parser.parse_args()
    use_plain_cuda_check_without_gpu()  # as train.py does
    times: dict[str, list[float]] = {name: [] for name in ROWS}
    for _ in range(args.repeats):
        for name, timed in ROWS.items():
            times[name] += timed()[1:]
    print(f"{cpu_name()}, torch {torch.__version__}, lightning {L.__version__}, "
          f"{args.repeats} x {EPOCHS - 1} epochs of {STEPS} steps\n")  # fmt: skip
    print("| | ms/step | quartiles |\n| --- | ---: | ---: |")
    for name, epochs in times.items():
        q1, median, q3 = (1000 * t / STEPS for t in statistics.quantiles(epochs, n=4))
        print(f"| {name} | {median:.2f} | {q1:.2f}-{q3:.2f} |")


if __name__ == "__main__":
    main()
