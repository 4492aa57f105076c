"""Where a training step's fixed cost goes: a net so small that almost nothing else is timed.

    python benchmarks/step_floor.py --repeats 8
    python benchmarks/step_floor.py --measure instructions --repeats 1

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
step takes S ms pays them as a fraction 1/S of its epoch. `--measure instructions` counts
instructions instead of seconds (callgrind, one thread; see meters.py): nearly the same count
for the same work however busy the machine is, so one repeat is enough.
"""

import argparse
import functools
import statistics
import tempfile
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from meters import PER_STEP, make_meter
from overhead import BareModule, TrainingMeter, compose_kindling, cpu_name
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from kindling.modules.classifier import Classifier
from kindling.run import provenance
from kindling.train import build_trainer

STEPS, BATCH, EPOCHS = 150, 128, 4
SCRATCH = tempfile.TemporaryDirectory(prefix="kindling-step-floor-")  # logs and checkpoints


def tiny_net() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))


class ClassifierLoggingEveryStep(Classifier):
    def training_step(self, batch, batch_idx):
        outputs = self.shared_step("train", batch)
        for name in ("train/loss", "train/acc"):
            self.log(name, self.epoch_metrics[name], on_step=False, on_epoch=True)
        return outputs["loss"]

    def on_train_epoch_end(self) -> None:
        pass  # logged in the steps


def data() -> tuple[DataLoader, DataLoader]:
    images, labels = torch.randn(STEPS * BATCH, 1, 8, 8), torch.randint(0, 10, (STEPS * BATCH,))
    train = DataLoader(TensorDataset(images, labels), batch_size=BATCH, shuffle=True)
    return train, DataLoader(TensorDataset(images[:256], labels[:256]), batch_size=BATCH)


def measure_plain(meter) -> list[float]:
    net, (train, _) = tiny_net(), data()
    optimizer = torch.optim.AdamW(net.parameters())
    epochs = []
    for _ in range(EPOCHS):
        meter.start()
        for images, targets in train:
            loss = F.cross_entropy(net(images), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        epochs.append(meter.stop())
    return epochs


def measure_lightning(meter, module: L.LightningModule, kindling_defaults: bool) -> list[float]:
    training_meter = TrainingMeter(meter)
    if kindling_defaults:  # the Trainer `train.py` builds, every callback and the CSV logger
        cfg = compose_kindling("cnn", "cpu", EPOCHS, Path(SCRATCH.name))
        trainer = build_trainer(cfg, provenance.collect(), extra_callbacks=[training_meter])
    else:
        trainer = L.Trainer(
            accelerator="cpu", max_epochs=EPOCHS, logger=False, callbacks=[training_meter],
            num_sanity_val_steps=0, enable_model_summary=False, enable_checkpointing=False,
            enable_progress_bar=False,
        )  # fmt: skip
    trainer.fit(module, *data())
    return training_meter.epochs


def classifier(module_class: type[Classifier] = Classifier) -> Classifier:
    return module_class(
        net=tiny_net(), num_classes=10, optimizer=functools.partial(torch.optim.AdamW)
    )


ROWS = {
    "plain loop": measure_plain,
    "Lightning, minimal module": lambda meter: measure_lightning(
        meter, BareModule(tiny_net(), functools.partial(torch.optim.AdamW)), False
    ),
    "+ kindling's Classifier": lambda meter: measure_lightning(meter, classifier(), False),
    "+ kindling's callbacks and CSV logger": lambda meter: measure_lightning(
        meter, classifier(), True
    ),
    "Classifier logging its metrics every step": lambda meter: measure_lightning(
        meter, classifier(ClassifierLoggingEveryStep), False
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--measure", choices=["time", "instructions"], default="time")
    args = parser.parse_args()
    meter = make_meter(args.measure)
    factor, unit = PER_STEP[meter.unit]
    measured: dict[str, list[float]] = {name: [] for name in ROWS}
    for _ in range(args.repeats):
        for name, measure in ROWS.items():
            measured[name] += measure(meter)[1:]
    print(f"{cpu_name()}, torch {torch.__version__}, lightning {L.__version__}, "
          f"{torch.get_num_threads()} threads, {args.repeats} x {EPOCHS - 1} epochs of "
          f"{STEPS} steps\n")  # fmt: skip
    print(f"| | {unit}/step | quartiles |\n| --- | ---: | ---: |")
    for name, epochs in measured.items():
        q1, median, q3 = (factor * x / STEPS for x in statistics.quantiles(epochs, n=4))
        print(f"| {name} | {median:.2f} | {q1:.2f}-{q3:.2f} |")


if __name__ == "__main__":
    main()
