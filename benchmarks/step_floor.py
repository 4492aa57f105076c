"""What a training step costs beyond its net: a net so small that almost nothing else is counted.

    python benchmarks/step_floor.py --measure instructions --repeats 1
    python benchmarks/step_floor.py --repeats 8

Every row trains one linear layer on kindling's default data (the 8x8 digits, batches of 8)
served by kindling's data module and loader, with the default optimizer (AdamW) and schedule
(warmup_cosine, stepped every step), all built from `configs/`: the same loader, optimizer and
schedule in every row. Each of the first four rows adds one layer to the row above it:

- plain loop: the loop everyone writes, over that loader;
- Lightning, minimal module: the same step in a minimal LightningModule, in a Trainer with no
  callbacks, logger or progress bar;
- + kindling's Classifier: kindling's module in the same bare Trainer; its steps also update
  its loss and accuracy metrics (logged once per epoch);
- + kindling's Trainer: the Trainer `train.py` builds (every default callback, the progress bar,
  the CSV logger): what a default run does per step;
- for comparison, the Classifier logging its metric objects with `self.log` in every step (the
  pattern many templates use), in the bare Trainer;
- and the Classifier in the bare Trainer with 10 callbacks that do nothing: what Lightning's
  calling of every hook on every callback costs by itself.

Every row times the training steps of an epoch (the first epoch of each run excluded), rows in
turn, `--repeats` rounds, all in one process. It ends with two quotients of medians: kindling's
whole step over Lightning's minimal one, and kindling's Trainer over the bare Trainer running the
same module and loader. `--measure instructions` counts instructions instead of seconds
(callgrind, one thread; see meters.py): nearly the same count for the same work however busy the
machine is, so one repeat is enough.
"""

import argparse
import statistics
import tempfile
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from hydra.utils import instantiate
from meters import PER_STEP, make_meter
from overhead import BareModule, TrainingMeter, compose_kindling, cpu_name
from torch import nn

from kindling.modules.classifier import Classifier
from kindling.run import provenance
from kindling.train import build_trainer

BATCH, EPOCHS = 8, 4
SCRATCH = tempfile.TemporaryDirectory(prefix="kindling-step-floor-")  # logs and checkpoints
CONFIG = compose_kindling(
    "cnn", "cpu", EPOCHS, Path(SCRATCH.name), (f"data.batch_size={BATCH}",), data="digits"
)


def tiny_net() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))


def digits() -> L.LightningDataModule:
    datamodule = instantiate(CONFIG.data)
    datamodule.prepare_data()
    return datamodule


def optimizer_and_schedule(parameters, total_steps: int):
    optimizer = instantiate(CONFIG.model.optimizer)(params=parameters)
    return optimizer, instantiate(CONFIG.model.scheduler)(optimizer, total_steps=total_steps)


class MinimalModule(BareModule):
    """overhead.py's bare step, with the default schedule stepped every step."""

    def __init__(self) -> None:
        super().__init__(tiny_net(), optimizer=None)

    def configure_optimizers(self):
        optimizer, schedule = optimizer_and_schedule(
            self.parameters(), self.trainer.estimated_stepping_batches
        )
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}


class ClassifierLoggingEveryStep(Classifier):
    def training_step(self, batch, batch_idx):
        outputs = self.shared_step("train", batch)
        for name in ("train/loss", "train/acc"):
            self.log(name, self.epoch_metrics[name], on_step=False, on_epoch=True)
        return outputs["loss"]

    def on_train_epoch_end(self) -> None:
        pass  # logged in the steps


def classifier(module_class: type[Classifier] = Classifier) -> Classifier:
    return module_class(
        net=tiny_net(), num_classes=10, optimizer=instantiate(CONFIG.model.optimizer),
        scheduler=instantiate(CONFIG.model.scheduler),
        scheduler_interval=CONFIG.model.scheduler_interval,
    )  # fmt: skip


def measure_plain(meter) -> list[float]:
    datamodule = digits()
    datamodule.setup("fit")
    loader = datamodule.train_dataloader()
    net = tiny_net()
    optimizer, schedule = optimizer_and_schedule(net.parameters(), EPOCHS * len(loader))
    epochs = []
    for _ in range(EPOCHS):
        meter.start()
        for batch in loader:
            images, targets = datamodule.on_after_batch_transfer(batch, 0)
            loss = F.cross_entropy(net(images), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
        epochs.append(meter.stop())
    return epochs


class DoesNothing(L.Callback):
    pass


def measure_lightning(
    meter, module: L.LightningModule, kindlings_trainer: bool, idle_callbacks: int = 0
) -> list[float]:
    training_meter = TrainingMeter(meter)
    datamodule = digits()
    if kindlings_trainer:  # as `train.py` builds it: every callback, the CSV logger
        trainer = build_trainer(
            CONFIG.copy(), provenance.collect(), extra_callbacks=[training_meter],
            datamodule=datamodule,
        )  # fmt: skip
    else:
        trainer = L.Trainer(
            accelerator="cpu", max_epochs=EPOCHS, logger=False,
            callbacks=[training_meter, *(DoesNothing() for _ in range(idle_callbacks))],
            num_sanity_val_steps=0, enable_model_summary=False, enable_checkpointing=False,
            enable_progress_bar=False,
        )  # fmt: skip
    trainer.fit(module, datamodule=datamodule)
    return training_meter.epochs


ROWS = {
    "plain loop": measure_plain,
    "Lightning, minimal module": lambda meter: measure_lightning(meter, MinimalModule(), False),
    "+ kindling's Classifier": lambda meter: measure_lightning(meter, classifier(), False),
    "+ kindling's Trainer (callbacks, progress bar, CSV logger)": lambda meter: measure_lightning(
        meter, classifier(), True
    ),
    "Classifier logging its metrics every step": lambda meter: measure_lightning(
        meter, classifier(ClassifierLoggingEveryStep), False
    ),
    "Classifier, bare Trainer with 10 callbacks that do nothing": lambda meter: measure_lightning(
        meter, classifier(), False, idle_callbacks=10
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=8)
    parser.add_argument("--measure", choices=["time", "instructions"], default="time")
    args = parser.parse_args()
    meter = make_meter(args.measure)
    factor, unit = PER_STEP[meter.unit]
    datamodule = digits()
    datamodule.setup("fit")
    steps = len(datamodule.train_dataloader())
    measured: dict[str, list[float]] = {name: [] for name in ROWS}
    for _ in range(args.repeats):
        for name, measure in ROWS.items():
            measured[name] += measure(meter)[1:]
    print(f"{cpu_name()}, torch {torch.__version__}, lightning {L.__version__}, "
          f"{torch.get_num_threads()} threads, {args.repeats} x {EPOCHS - 1} epochs of "
          f"{steps} steps\n")  # fmt: skip
    print(f"| | {unit}/step | quartiles |\n| --- | ---: | ---: |")
    medians = {}
    for name, epochs in measured.items():
        q1, medians[name], q3 = (factor * x / steps for x in statistics.quantiles(epochs, n=4))
        print(f"| {name} | {medians[name]:.2f} | {q1:.2f}-{q3:.2f} |")
    minimal, bare, whole = (medians[name] for name in list(ROWS)[1:4])
    print(f"\nkindling's whole step / Lightning's minimal step: {whole / minimal:.3f}")
    print(f"kindling's Trainer / a bare Trainer, same module and loader: {whole / bare:.3f}")


if __name__ == "__main__":
    main()
