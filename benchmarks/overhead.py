"""kindling's overhead over a hand-written PyTorch loop, per model family.

    python benchmarks/overhead.py                    # every family, on CUDA when present, else CPU
    python benchmarks/overhead.py --models cnn --epochs 6 --repeats 5

For each model (cnn, rnn, lstm, transformer) both sides train the same net (same initial
weights), with the same optimizer, batch size and batches of the same in-memory data:

- plain: the loop everyone writes (`.to(device)`, forward, loss, backward, step);
- kindling: `kindling.modules.Classifier` through the Lightning Trainer that `train.py` builds,
  with kindling's default callbacks (checkpoints, early stopping, progress bar, model summary,
  learning-rate monitor, divergence check) and CSV logger.

The timed part is the training steps of an epoch: from the start of the epoch to its end (plain)
or to the start of validation (kindling), with the device synchronised before each clock read.
The first epoch is warm-up and not counted; each measurement is the median epoch of a run; runs
are repeated, alternating which side goes first, and the median run is reported.
Writes `overhead.json` and `overhead.md` to `benchmarks/results/` (or `--out`).
"""

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import lightning as L
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.utils import instantiate
from lightning.pytorch.callbacks import Callback
from omegaconf import open_dict
from torch.utils.data import DataLoader, TensorDataset

import kindling.train  # noqa: F401 - registers kindling's config resolvers
from kindling.data.image import ImageDataModule, Split
from kindling.utils import instantiate_group

ROOT = Path(__file__).resolve().parents[1]
IMAGE_SHAPE = (1, 28, 28)


def synthetic_images(num: int, seed: int = 0) -> Split:
    generator = torch.Generator().manual_seed(seed)
    images = torch.rand(num, *IMAGE_SHAPE, generator=generator)
    return images, torch.randint(0, 10, (num,), generator=generator)


class SyntheticDataModule(ImageDataModule):
    """MNIST-sized random images: the DataLoader path kindling uses for MNIST."""

    def __init__(self, num_train: int, **kwargs):
        super().__init__(**kwargs)
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


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def compose_kindling(
    model: str, accelerator: str, epochs: int, tmp: Path, overrides: tuple[str, ...] = ()
):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose(
            "train",
            [f"model={model}", f"trainer.accelerator={accelerator}", f"trainer.max_epochs={epochs}",
             "data=mnist", "callbacks.early_stopping.patience=1000", *overrides],
            return_hydra_config=True,
        )  # fmt: skip
    GlobalHydra.instance().clear()
    with open_dict(cfg):
        del cfg["hydra"]
        cfg.paths.output_dir = str(tmp)
        cfg.paths.data_dir = str(tmp)
    return cfg


class EpochTimer(Callback):
    """Training time of each epoch: from its start to the start of validation."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self._start = 0.0

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        sync(trainer.strategy.root_device)
        self._start = time.perf_counter()

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        sync(trainer.strategy.root_device)
        self.times.append(time.perf_counter() - self._start)


def time_kindling(model: str, args, tmp: Path) -> tuple[list[float], int]:
    cfg = compose_kindling(model, args.accelerator, args.epochs, tmp, tuple(args.overrides))
    L.seed_everything(0, workers=True)
    module = instantiate(cfg.model, _convert_="all")
    datamodule = SyntheticDataModule(
        num_train=args.samples, data_dir=str(tmp), num_classes=10, image_shape=list(IMAGE_SHAPE),
        batch_size=args.batch_size, val_fraction=0.02, num_workers=0,
    )  # fmt: skip
    timer = EpochTimer()
    callbacks = [*instantiate_group(cfg.callbacks, "callbacks"), timer]
    loggers = instantiate_group(cfg.logger, "logger")
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers, _convert_="all")
    trainer.fit(module, datamodule=datamodule)
    return timer.times, trainer.num_training_batches


def time_plain(model: str, args, tmp: Path, device: torch.device) -> list[float]:
    cfg = compose_kindling(model, args.accelerator, args.epochs, tmp)
    L.seed_everything(0, workers=True)
    net = instantiate(cfg.model.net).to(device)
    optimizer = instantiate(cfg.model.optimizer)(params=net.parameters())
    datamodule = SyntheticDataModule(
        num_train=args.samples, data_dir=str(tmp), num_classes=10, image_shape=list(IMAGE_SHAPE),
        batch_size=args.batch_size, val_fraction=0.02, num_workers=0,
    )  # fmt: skip
    datamodule.setup("fit")  # the same standardised tensors and split as kindling's side
    images, labels = datamodule.data_train.tensors
    loader = DataLoader(
        TensorDataset(images, labels), batch_size=args.batch_size, shuffle=True,
        pin_memory=device.type == "cuda",
    )  # fmt: skip
    times = []
    for _ in range(args.epochs):
        net.train()
        sync(device)
        start = time.perf_counter()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = F.cross_entropy(net(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        sync(device)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["cnn", "rnn", "lstm", "transformer"])
    parser.add_argument("--epochs", type=int, default=5, help="per run; the first is warm-up")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--accelerator", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for kindling's side")
    args = parser.parse_args()

    device = torch.device("cuda" if args.accelerator in ("cuda", "gpu") else "cpu")
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    results = []
    tmp = Path("/tmp") / "kindling-benchmark"
    for model in args.models:
        plain_runs, kindling_runs = [], []
        for repeat in range(args.repeats):
            # Alternate the order so that neither side always runs on a warmer machine.
            sides = ["plain", "kindling"] if repeat % 2 == 0 else ["kindling", "plain"]
            for side in sides:
                if side == "plain":
                    plain_runs.append(statistics.median(time_plain(model, args, tmp, device)[1:]))
                else:
                    times, steps = time_kindling(model, args, tmp / "kindling")
                    kindling_runs.append(statistics.median(times[1:]))
        plain, kindling = statistics.median(plain_runs), statistics.median(kindling_runs)
        row = {
            "model": model,
            "steps_per_epoch": steps,
            "plain_ms_per_step": 1000 * plain / steps,
            "kindling_ms_per_step": 1000 * kindling / steps,
            "plain_samples_per_s": steps * args.batch_size / plain,
            "kindling_samples_per_s": steps * args.batch_size / kindling,
            "ratio": kindling / plain,
        }
        results.append(row)
        print(
            f"{model:12s} plain {row['plain_ms_per_step']:7.2f} ms/step  "
            f"kindling {row['kindling_ms_per_step']:7.2f} ms/step  ratio {row['ratio']:.3f}",
            flush=True,
        )

    report = {
        "device": str(device),
        "hardware": hardware,
        "torch": torch.__version__,
        "lightning": L.__version__,
        "threads": torch.get_num_threads(),
        "settings": {k: str(v) for k, v in vars(args).items()},
        "results": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "overhead.json").write_text(json.dumps(report, indent=2))
    lines = [
        f"Device: {device} ({hardware}), torch {torch.__version__}, lightning {L.__version__}, "
        f"{args.samples} samples of {IMAGE_SHAPE}, batch {args.batch_size}, "
        f"median of {args.repeats} runs x {args.epochs - 1} timed epochs",
        "",
        "| model | plain ms/step | kindling ms/step | plain samples/s | kindling samples/s "
        "| kindling / plain |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['model']} | {r['plain_ms_per_step']:.2f} | {r['kindling_ms_per_step']:.2f} "
        f"| {r['plain_samples_per_s']:.0f} | {r['kindling_samples_per_s']:.0f} | {r['ratio']:.3f} |"
        for r in results
    ]
    (args.out / "overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
