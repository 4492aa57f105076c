"""kindling's overhead over a hand-written PyTorch loop, per model family.

    python benchmarks/overhead.py                    # every family, on CUDA when present, else CPU
    python benchmarks/overhead.py --models rnn --epochs 9 --repeats 3
    python benchmarks/overhead.py --models cnn transformer --precision bf16-mixed --epochs 5
    python benchmarks/overhead.py --measure instructions --models rnn --epochs 3 --repeats 1

For each model (cnn, rnn, lstm, transformer) every side trains the same net (same initial
weights), with the same optimizer, batch size, precision and batches of the same in-memory data:

- plain: the loop everyone writes (`.to(device)`, forward, loss, backward, step);
- lightning: the same step in a bare LightningModule, in a Trainer with no callbacks, logger,
  progress bar or checkpointing: the cost of Lightning's loop alone;
- kindling: `kindling.modules.classifier.Classifier` in the Trainer that `train.py` builds
  (`kindling.train.build_trainer`): the default callbacks (checkpoints, early stopping, progress
  bar, model summary, learning-rate monitor, divergence check, device report, plots), the four
  that every run has (config and provenance in the checkpoint, random state, metrics kept on
  resume, checkpoint on interrupt) and the CSV logger.

`--precision` (32-true, bf16-mixed, 16-mixed) is every side's: the Trainers get it as
`precision=`, the plain loop runs its forward and loss under the `torch.autocast` that
Lightning's MixedPrecision plugin enters (and, for 16-mixed, scales the loss with a GradScaler
as the plugin does). The JSON has each Trainer's `precision` and, for every side, the dtype
of the net's output in its first training step (`output_dtype`).

Every side reads the same tensors through a DataLoader, one index per batch (kindling's
`BatchIndexedTensors`), from pinned host memory with non-blocking copies on CUDA: kindling's
`data.on_device` is off here. The GPU-resident path would serve the Trainer sides from
kindling's `DeviceTensorLoader` and leave the plain loop a loader of its own, a different data
path on each side; a DataLoader is the one path all three share, on a CPU as on a GPU, and the
one any data set too big for the GPU takes. The Trainers' `benchmark` (cudnn.benchmark) is
kindling's for both, and the plain loop, in the same process, runs with it too.

The timed part is the training steps of an epoch: from the start of the epoch to its end (plain)
or to the start of validation (Trainer), with the device synchronised before each clock read.
Each Trainer side runs in one process with the plain loop, epoch by epoch: each of its epochs
has a plain epoch right next to it (before it, then after it, in turn), and the first epoch of
each side is warm-up. A side's ratio is the median over all pairs of side / plain, with its
quartiles; kindling / lightning is the quotient of the two medians. ms/step and samples/s are
the medians of each side. Each side's run is repeated `--repeats` times.

`--measure instructions` counts instructions instead of seconds (valgrind's callgrind, CPU,
one thread; see meters.py): nearly the same count for the same work however busy the machine
is, at about 50 times the run time. The table then gives millions of instructions per step.
Writes `overhead.json` and `overhead.md` (`overhead_instructions.*` when counting instructions)
to `benchmarks/results/` (or `--out`).
"""

import argparse
import json
import os
import platform
import statistics
import tempfile
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback
from meters import PER_STEP, make_meter
from omegaconf import open_dict
from torch.utils.data import DataLoader

from kindling.data.in_memory import InMemoryImageDataModule, Split
from kindling.run import provenance
from kindling.train import build_trainer  # also registers kindling's config resolvers

ROOT = Path(__file__).resolve().parents[1]
IMAGE_SHAPE = (1, 28, 28)
SIDES = ("kindling", "lightning")
PRECISIONS = ("32-true", "bf16-mixed", "16-mixed")
PLACEMENT = (
    "in-memory tensors, a DataLoader batch by one index; pinned, non-blocking copies on CUDA"
)


def synthetic_images(num: int, seed: int = 0) -> Split:
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(num, *IMAGE_SHAPE, generator=generator)
    return images, torch.randint(0, 10, (num,), generator=generator)


class SyntheticDataModule(InMemoryImageDataModule):
    """MNIST-sized random images, served by a DataLoader on every device (see PLACEMENT)."""

    def __init__(self, num_train: int, **kwargs):
        super().__init__(on_device=False, **kwargs)
        self.num_train = num_train

    def load_splits(self) -> tuple[Split, Split]:
        return synthetic_images(self.num_train), synthetic_images(256, seed=1)


def cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()}, {os.cpu_count()} cores"
    return platform.processor() or "unknown CPU"


def compose_kindling(
    model: str, accelerator: str, epochs: int, tmp: Path, overrides: tuple[str, ...] = (),
    data: str = "mnist",
):  # fmt: skip
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(
            "train",
            [f"model={model}", f"trainer.accelerator={accelerator}", f"trainer.max_epochs={epochs}",
             f"data={data}", *overrides],
            return_hydra_config=True,
        )  # fmt: skip
    GlobalHydra.instance().clear()
    with open_dict(cfg):
        del cfg["hydra"]
        cfg.paths.output_dir = str(tmp)
        cfg.paths.data_dir = str(tmp)
    return cfg


def output_dtype(net: torch.nn.Module) -> list[str]:
    """Filled with the dtype of `net`'s output in its first training step (a one-shot hook)."""
    seen: list[str] = []

    def hook(module: torch.nn.Module, inputs, output: torch.Tensor) -> None:
        if module.training:
            seen.append(str(output.dtype).removeprefix("torch."))
            handle.remove()

    handle = net.register_forward_hook(hook)
    return seen


class PlainLoop:
    """The loop everyone writes, on its own copy of the net (same initial weights)."""

    def __init__(
        self, cfg, datamodule: InMemoryImageDataModule, batch_size: int, device: torch.device,
        meter, precision: str,
    ) -> None:  # fmt: skip
        L.seed_everything(0, workers=True)
        self.net = instantiate(cfg.model.net).to(device)
        self.output_dtype = output_dtype(self.net)
        self.optimizer = instantiate(cfg.model.optimizer)(params=self.net.parameters())
        train = datamodule.data_train  # kindling's standardised split, one index per batch
        self.loader = DataLoader(
            train, batch_size=batch_size, shuffle=True, collate_fn=train.collate,
            pin_memory=device.type == "cuda",
        )  # fmt: skip
        self.device = device
        self.meter = meter
        self.precision = precision
        # A loss scaler for float16 only, as Lightning's MixedPrecision plugin makes one.
        self.scaler = torch.amp.GradScaler(device.type) if precision == "16-mixed" else None

    def autocast(self) -> AbstractContextManager:
        """What Lightning's precision plugin enters around forward and loss."""
        if self.precision == "32-true":
            return nullcontext()
        dtype = torch.bfloat16 if self.precision == "bf16-mixed" else torch.float16
        return torch.autocast(self.device.type, dtype=dtype, cache_enabled=False)

    def epoch(self) -> float:
        """One training epoch, measured (seconds or instructions)."""
        self.net.train()
        self.meter.start()
        for x, y in self.loader:
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with self.autocast():
                loss = F.cross_entropy(self.net(x), y)
            self.optimizer.zero_grad(set_to_none=True)
            if self.scaler is None:
                loss.backward()
                self.optimizer.step()
            else:
                self.scaler.scale(loss).backward()
                self.scaler.step(self.optimizer)
                self.scaler.update()
        return self.meter.stop()


class BareModule(L.LightningModule):
    """The plain loop's step as a LightningModule: what Lightning's loop costs by itself."""

    def __init__(self, net: torch.nn.Module, optimizer) -> None:
        super().__init__()
        self.net = net
        self.optimizer_factory = optimizer

    def training_step(self, batch, batch_idx):
        images, targets = batch
        return F.cross_entropy(self.net(images), targets)

    def validation_step(self, batch, batch_idx) -> None:
        images, targets = batch
        F.cross_entropy(self.net(images), targets)

    def configure_optimizers(self):
        return self.optimizer_factory(params=self.parameters())


class TrainingMeter(Callback):
    """Measures each Trainer training epoch: from its start to the start of validation."""

    def __init__(self, meter) -> None:
        self.meter = meter
        self.epochs: list[float] = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.meter.start()

    def on_validation_start(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self.epochs.append(self.meter.stop())


class InterleavedMeter(TrainingMeter):
    """Measures each Trainer training epoch and runs one plain epoch next to it: before it on
    even epochs, after its validation on odd ones.

    Epoch times on a shared machine drift by 10-20% from run to run; two epochs seconds apart
    see the same machine, so their ratio is what measures the Trainer side's cost.
    """

    def __init__(self, plain: PlainLoop) -> None:
        super().__init__(plain.meter)
        self.plain = plain
        self.plain_epochs: list[float] = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch % 2 == 0:
            self.plain_epochs.append(self.plain.epoch())
        super().on_train_epoch_start(trainer, pl_module)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        # After validation: it runs without autograd, which the plain loop needs.
        if trainer.current_epoch % 2 == 1:
            self.plain_epochs.append(self.plain.epoch())


def measure_against_plain(
    side: str, model: str, args, tmp: Path, device: torch.device, meter
) -> tuple[InterleavedMeter, L.Trainer, list[str]]:
    """One fit of `args.epochs` epochs on `side` ("kindling" or "lightning") with a plain epoch
    next to each."""
    overrides = (f"trainer.precision={args.precision}", *args.overrides)
    cfg = compose_kindling(model, args.accelerator, args.epochs, tmp, overrides)
    datamodule = SyntheticDataModule(
        num_train=args.samples, data_dir=str(tmp), num_classes=10, image_shape=list(IMAGE_SHAPE),
        batch_size=args.batch_size, val_fraction=0.02, num_workers=0,
    )  # fmt: skip
    datamodule.setup("fit")  # the plain loop trains on the same standardised split
    plain = PlainLoop(cfg, datamodule, args.batch_size, device, meter, args.precision)
    interleaved = InterleavedMeter(plain)
    L.seed_everything(0, workers=True)
    if side == "kindling":
        module = instantiate(cfg.model, _convert_="all")
        # The Trainer `train.py` builds: configured and always-on callbacks, loggers.
        trainer = build_trainer(cfg, provenance.collect(), extra_callbacks=[interleaved])
    else:
        module = BareModule(instantiate(cfg.model.net), instantiate(cfg.model.optimizer))
        trainer = L.Trainer(
            accelerator=args.accelerator, devices=1, max_epochs=args.epochs,
            precision=args.precision, benchmark=cfg.trainer.benchmark,
            callbacks=[interleaved], logger=False, enable_checkpointing=False,
            enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp,
        )  # fmt: skip
    dtype = output_dtype(module.net)
    trainer.fit(module, datamodule=datamodule)
    return interleaved, trainer, dtype


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["cnn", "rnn", "lstm", "transformer"])
    parser.add_argument("--epochs", type=int, default=9, help="per run; the first is warm-up")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--accelerator", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--precision",
        choices=PRECISIONS,
        default="32-true",
        help="every side's (default: %(default)s)",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument(
        "--sides", nargs="+", choices=SIDES, default=list(SIDES),
        help="what to measure against the plain loop",
    )  # fmt: skip
    parser.add_argument("--measure", choices=["time", "instructions"], default="time")
    parser.add_argument("--threads", type=int, help="torch's CPU threads (default: torch's own)")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for kindling's side")
    args = parser.parse_args()
    if args.epochs < 2:
        parser.error("--epochs must be 2 or more: the first epoch of each run is warm-up.")
    if args.measure == "instructions":
        args.accelerator = "cpu"  # callgrind counts what the CPU runs
    if args.precision == "16-mixed" and args.accelerator == "cpu":
        # Lightning would run bf16-mixed instead: the plain loop would not be doing the same.
        parser.error("--precision 16-mixed needs CUDA; on a CPU use bf16-mixed.")
    if args.threads:
        torch.set_num_threads(args.threads)  # before make_meter, which counts with one thread
    device = torch.device("cuda" if args.accelerator in ("cuda", "gpu") else "cpu")
    meter = make_meter(args.measure, device)  # instructions: this script again, under callgrind

    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    results = []
    with tempfile.TemporaryDirectory(prefix="kindling-benchmark-") as tmp:
        for model in args.models:
            row = measure_model(model, args, Path(tmp), device, meter)
            results.append(row)
            print(summary_line(row, args.sides, meter.unit), flush=True)

    report = {
        "device": str(device),
        "hardware": hardware,
        "torch": torch.__version__,
        "lightning": L.__version__,
        "threads": torch.get_num_threads(),
        "precision": args.precision,
        "placement": PLACEMENT,
        "unit": meter.unit,
        "settings": {k: str(v) for k, v in vars(args).items()},
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    name = "overhead" if args.measure == "time" else "overhead_instructions"
    (args.out / f"{name}.json").write_text(json.dumps(report, indent=2))
    title = (
        f"Device: {device} ({hardware}), torch {torch.__version__}, lightning {L.__version__}, "
        f"{torch.get_num_threads()} threads, {args.samples} samples of {IMAGE_SHAPE}, "
        f"batch {args.batch_size}, precision {args.precision} on every side, data: {PLACEMENT}; "
        f"{args.repeats} runs x {args.epochs - 1} measured pairs of epochs per side, measured "
        f"in {meter.unit}"
    )
    lines = [title, "", *markdown_table(results, args.sides, meter.unit)]
    (args.out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def measure_model(model: str, args, tmp: Path, device: torch.device, meter) -> dict:
    """Every side's epochs against plain epochs, the sides' runs taking turns."""
    epochs: dict[str, dict[str, list[float]]] = {
        side: {"plain": [], "side": []} for side in args.sides
    }
    steps = 0
    precisions, dtypes = {}, {}
    for _ in range(args.repeats):
        for side in args.sides:
            interleaved, trainer, dtype = measure_against_plain(
                side, model, args, tmp / side, device, meter
            )
            steps, precisions[side] = trainer.num_training_batches, trainer.precision
            (dtypes[side],), (dtypes["plain"],) = dtype, interleaved.plain.output_dtype
            # The first epoch of each side is warm-up.
            epochs[side]["plain"] += interleaved.plain_epochs[1:]
            epochs[side]["side"] += interleaved.epochs[1:]
    row: dict = {"model": model, "steps_per_epoch": steps, "batch_size": args.batch_size}
    row["plain_output_dtype"] = dtypes["plain"]
    all_plain = [t for side in args.sides for t in epochs[side]["plain"]]
    row["plain_per_step"] = statistics.median(all_plain) / steps
    for side in args.sides:
        ratios = [t / p for t, p in zip(epochs[side]["side"], epochs[side]["plain"], strict=True)]
        # One pair has no spread to show; quartiles need two.
        q1, _, q3 = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
        row[side] = {
            "per_step": statistics.median(epochs[side]["side"]) / steps,
            "ratio": statistics.median(ratios),
            "ratio_q1": q1,
            "ratio_q3": q3,
            "precision": precisions[side],  # as the side's Trainer ran it
            "output_dtype": dtypes[side],
            "epochs": epochs[side]["side"],
            "plain_epochs": epochs[side]["plain"],
        }
    if {"kindling", "lightning"} <= set(args.sides):
        row["kindling_over_lightning"] = row["kindling"]["ratio"] / row["lightning"]["ratio"]
    return row


def summary_line(row: dict, sides: list[str], unit: str) -> str:
    factor, name = PER_STEP[unit]
    parts = [f"{row['model']:12s} plain {factor * row['plain_per_step']:7.2f} {name}/step"]
    for side in sides:
        r = row[side]
        parts.append(
            f"{side} {factor * r['per_step']:7.2f} {name}/step, x{r['ratio']:.3f} "
            f"({r['ratio_q1']:.3f}-{r['ratio_q3']:.3f})"
        )
    return "  ".join(parts)


def markdown_table(results: list[dict], sides: list[str], unit: str) -> list[str]:
    factor, name = PER_STEP[unit]
    per_second = unit == "s"  # samples/s only where the meter is a clock
    header = ["model", f"plain {name}/step", *(f"{side} {name}/step" for side in sides)]
    if per_second:
        header += ["plain samples/s", *(f"{side} samples/s" for side in sides)]
    header += [f"{side} / plain (quartiles)" for side in sides]
    both = "kindling_over_lightning" in results[0]
    header += ["kindling / lightning"] if both else []
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    for row in results:
        per_steps = [row["plain_per_step"], *(row[side]["per_step"] for side in sides)]
        cells = [row["model"], *(f"{factor * x:.2f}" for x in per_steps)]
        if per_second:
            cells += [f"{row['batch_size'] / x:.0f}" for x in per_steps]
        cells += [
            f"{row[side]['ratio']:.3f} ({row[side]['ratio_q1']:.3f}-{row[side]['ratio_q3']:.3f})"
            for side in sides
        ]
        cells += [f"{row['kindling_over_lightning']:.3f}"] if both else []
        lines.append("| " + " | ".join(cells) + " |")
    lines += [
        "",
        "Each side / plain is the median of the per-pair ratios (an epoch of the side over the "
        "plain epoch next to it), with the quartiles of those ratios; per-step columns are "
        "each side's median epoch, so dividing them gives a nearby but different number."
        + (" kindling / lightning divides the two sides' median ratios." if both else ""),
    ]
    return lines


if __name__ == "__main__":
    main()
