"""kindling's overhead over a hand-written PyTorch loop, per model family.

    python benchmarks/overhead.py                    # every family, on CUDA when present, else CPU
    python benchmarks/overhead.py --models rnn --epochs 9 --repeats 3

For each model (cnn, rnn, lstm, transformer) both sides train the same net (same initial
weights), with the same optimizer, batch size and batches of the same in-memory data:

- plain: the loop everyone writes (`.to(device)`, forward, loss, backward, step);
- kindling: `kindling.modules.Classifier` through the Lightning Trainer that `train.py` builds,
  with kindling's default callbacks (checkpoints, early stopping, progress bar, model summary,
  learning-rate monitor, divergence check) and CSV logger.

The timed part is the training steps of an epoch: from the start of the epoch to its end (plain)
or to the start of validation (kindling), with the device synchronised before each clock read.
Both run in one process, epoch by epoch: each kindling epoch has a plain epoch right next to it
(before it, then after it, in turn), and the first epoch of each side is warm-up. The ratio
reported is the median over all pairs of kindling / plain, with its quartiles; ms/step and
samples/s are the medians of each side. A run is repeated `--repeats` times.
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
from kindling.utils.cuda import use_plain_cuda_check_without_gpu

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


class PlainLoop:
    """The loop everyone writes, on its own copy of the net (same initial weights)."""

    def __init__(self, cfg, datamodule: ImageDataModule, batch_size: int, device: torch.device):
        L.seed_everything(0, workers=True)
        self.net = instantiate(cfg.model.net).to(device)
        self.optimizer = instantiate(cfg.model.optimizer)(params=self.net.parameters())
        images, labels = datamodule.data_train.tensors  # kindling's standardised train split
        self.loader = DataLoader(
            TensorDataset(images, labels), batch_size=batch_size, shuffle=True,
            pin_memory=device.type == "cuda",
        )  # fmt: skip
        self.device = device

    def epoch(self) -> float:
        """Seconds for one training epoch."""
        self.net.train()
        sync(self.device)
        start = time.perf_counter()
        for x, y in self.loader:
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            loss = F.cross_entropy(self.net(x), y)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self.optimizer.step()
        sync(self.device)
        return time.perf_counter() - start


class InterleavedTimer(Callback):
    """Times each kindling training epoch (its start to the start of validation) and runs one
    plain epoch next to it: before it on even epochs, after its validation on odd ones.

    Epoch times on a shared machine drift by 10-20% from run to run; two epochs seconds apart
    see the same machine, so their ratio is what measures kindling's cost.
    """

    def __init__(self, plain: PlainLoop) -> None:
        self.plain = plain
        self.plain_times: list[float] = []
        self.kindling_times: list[float] = []
        self._start = 0.0

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if trainer.current_epoch % 2 == 0:
            self.plain_times.append(self.plain.epoch())
        sync(trainer.strategy.root_device)
        self._start = time.perf_counter()

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        sync(trainer.strategy.root_device)
        self.kindling_times.append(time.perf_counter() - self._start)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        # After validation: it runs without autograd, which the plain loop needs.
        if trainer.current_epoch % 2 == 1:
            self.plain_times.append(self.plain.epoch())


def time_both(model: str, args, tmp: Path, device: torch.device) -> tuple[InterleavedTimer, int]:
    """One kindling fit of `args.epochs` epochs with a plain epoch next to each."""
    cfg = compose_kindling(model, args.accelerator, args.epochs, tmp, tuple(args.overrides))
    datamodule = SyntheticDataModule(
        num_train=args.samples, data_dir=str(tmp), num_classes=10, image_shape=list(IMAGE_SHAPE),
        batch_size=args.batch_size, val_fraction=0.02, num_workers=0,
    )  # fmt: skip
    datamodule.setup("fit")  # the plain loop trains on the same standardised split
    timer = InterleavedTimer(PlainLoop(cfg, datamodule, args.batch_size, device))
    L.seed_everything(0, workers=True)
    module = instantiate(cfg.model, _convert_="all")
    callbacks = [*instantiate_group(cfg.callbacks, "callbacks"), timer]
    loggers = instantiate_group(cfg.logger, "logger")
    trainer = instantiate(cfg.trainer, callbacks=callbacks, logger=loggers, _convert_="all")
    trainer.fit(module, datamodule=datamodule)
    return timer, trainer.num_training_batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["cnn", "rnn", "lstm", "transformer"])
    parser.add_argument("--epochs", type=int, default=9, help="per run; the first is warm-up")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--accelerator", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for kindling's side")
    args = parser.parse_args()
    use_plain_cuda_check_without_gpu()  # as train.py does

    device = torch.device("cuda" if args.accelerator in ("cuda", "gpu") else "cpu")
    hardware = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()
    results = []
    tmp = Path("/tmp") / "kindling-benchmark"
    for model in args.models:
        plain_runs, kindling_runs = [], []
        for _ in range(args.repeats):
            timer, steps = time_both(model, args, tmp / "kindling", device)
            # The first epoch of each side is warm-up.
            plain_runs += timer.plain_times[1:]
            kindling_runs += timer.kindling_times[1:]
        ratios = sorted(k / p for k, p in zip(kindling_runs, plain_runs, strict=True))
        quartiles = statistics.quantiles(ratios, n=4)
        plain, kindling = statistics.median(plain_runs), statistics.median(kindling_runs)
        row = {
            "model": model,
            "steps_per_epoch": steps,
            "plain_ms_per_step": 1000 * plain / steps,
            "kindling_ms_per_step": 1000 * kindling / steps,
            "plain_samples_per_s": steps * args.batch_size / plain,
            "kindling_samples_per_s": steps * args.batch_size / kindling,
            "ratio": statistics.median(ratios),
            "ratio_q1": quartiles[0],
            "ratio_q3": quartiles[2],
            "plain_epoch_s": plain_runs,
            "kindling_epoch_s": kindling_runs,
        }
        results.append(row)
        print(
            f"{model:12s} plain {row['plain_ms_per_step']:7.2f} ms/step  "
            f"kindling {row['kindling_ms_per_step']:7.2f} ms/step  ratio {row['ratio']:.3f} "
            f"(quartiles {row['ratio_q1']:.3f}-{row['ratio_q3']:.3f})",
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
        f"{args.repeats} runs x {args.epochs - 1} timed pairs of epochs",
        "",
        "| model | plain ms/step | kindling ms/step | plain samples/s | kindling samples/s "
        "| kindling / plain | quartiles |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    lines += [
        f"| {r['model']} | {r['plain_ms_per_step']:.2f} | {r['kindling_ms_per_step']:.2f} "
        f"| {r['plain_samples_per_s']:.0f} | {r['kindling_samples_per_s']:.0f} | {r['ratio']:.3f} "
        f"| {r['ratio_q1']:.3f}-{r['ratio_q3']:.3f} |"
        for r in results
    ]
    (args.out / "overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
