"""Tokens per second and MFU of the character language model, GPT-2-small's body by default.

    python benchmarks/lm_throughput.py                   # 12 layers, width 768, context 1024, bf16
    python benchmarks/lm_throughput.py --compile         # the same with model.compile=true
    python benchmarks/lm_throughput.py --size tiny --steps 6 --warmup 2   # the mechanics, on a CPU

Trains `experiment=charlm` on synthetic text through the Trainer `train.py` builds
(`kindling.train.build_trainer`), with kindling's throughput meter (`ThroughputWithMFU`), which
counts the FLOPs of a batch and knows the device's peak. The text is a seeded Markov chain over
64 characters, written to a temporary file (nothing is downloaded). Validation, sampling and
checkpoints are off: the timed part is training steps alone.

Every step is timed from the end of the step before it (so the batch's loading counts), with
the device synchronised. The first `--warmup` steps (compilation, cuDNN and allocator warm-up)
are reported apart as `warmup_s`; the median of the rest gives tokens/s and MFU (FLOPs per batch
over the median step time, over the peak). Writes `lm_throughput.json` to `--out`.
"""

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import lightning as L
import numpy as np
import torch
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from lightning.pytorch.callbacks import Callback
from omegaconf import open_dict

from kindling.callbacks.throughput import ThroughputWithMFU
from kindling.config.instantiate import build
from kindling.run import provenance
from kindling.train import build_trainer  # also registers kindling's config resolvers

ROOT = Path(__file__).resolve().parents[1]
# d_model, layers, heads, context, batch
SIZES = {"gpt2": (768, 12, 12, 1024, 32), "tiny": (64, 2, 2, 64, 8)}


def synthetic_text(path: Path, characters: int, seed: int = 0) -> None:
    """A first-order Markov chain over 64 characters, each followed by one of 8 others."""
    rng = np.random.default_rng(seed)
    alphabet = np.array(list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,\n"))
    successors = rng.integers(0, len(alphabet), size=(len(alphabet), 8))
    choices = rng.integers(0, 8, size=characters)
    ids = np.empty(characters, dtype=np.int64)
    ids[0] = 0
    for i in range(1, characters):
        ids[i] = successors[ids[i - 1], choices[i]]
    path.write_text("".join(alphabet[ids]))


class StepClock(Callback):
    """Seconds of every training step, from the end of the one before (the start of training
    for the first), with the device's queued work finished before each clock read."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._last = 0.0
        self.device = torch.device("cpu")  # where training ran: Lightning moves the module back

    def _now(self, pl_module: L.LightningModule) -> float:
        if pl_module.device.type == "cuda":
            torch.cuda.synchronize(pl_module.device)
        return time.perf_counter()

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.device = pl_module.device
        self._last = self._now(pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        now = self._now(pl_module)
        self.seconds.append(now - self._last)
        self._last = now


def compose_lm(args: argparse.Namespace, text: Path, out: Path):
    d_model, layers, heads, context, batch = SIZES[args.size]
    overrides = [
        "experiment=charlm", f"trainer.accelerator={args.accelerator}",
        f"trainer.precision={args.precision}", f"data.path={text}",
        f"data.context_length={context}", f"data.batch_size={args.batch_size or batch}",
        f"model.net.d_model={d_model}", f"model.net.num_layers={layers}",
        f"model.net.num_heads={heads}", "model.net.dropout=0.0", f"model.compile={args.compile}",
        "model.sample_length=0", f"trainer.max_steps={args.warmup + args.steps}",
        "trainer.max_epochs=-1", "trainer.limit_train_batches=1.0", "trainer.limit_val_batches=0",
        "trainer.num_sanity_val_steps=0", "trainer.enable_checkpointing=false",
        "callbacks.rich_progress_bar=null",
        "callbacks.rich_model_summary=null", "callbacks.plots=null", "logger=none",
        "trainer.enable_progress_bar=false", "trainer.enable_model_summary=false",
    ]  # fmt: skip
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(ROOT / "configs"), version_base="1.3"):
        cfg = compose("train", overrides, return_hydra_config=True)
    GlobalHydra.instance().clear()
    with open_dict(cfg):
        del cfg["hydra"]
        cfg.paths.output_dir = cfg.paths.log_dir = cfg.paths.data_dir = str(out)
    return cfg


def measure(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory(prefix="kindling-lm-") as tmp:
        text = Path(tmp) / "text.txt"
        _, _, _, context, batch = SIZES[args.size]
        batch = args.batch_size or batch
        # Enough windows for every step in one epoch of training text (80% of it).
        synthetic_text(text, int(1.3 * context * batch * (args.warmup + args.steps)) + 10_000)
        cfg = compose_lm(args, text, Path(tmp))
        L.seed_everything(0)
        torch.set_float32_matmul_precision(cfg.float32_matmul_precision)
        datamodule = build(cfg.data, "data")
        module = build(cfg.model, "model")
        clock, meter = StepClock(), ThroughputWithMFU()
        trainer = build_trainer(cfg, provenance.collect(), extra_callbacks=[meter, clock])
        trainer.fit(module, datamodule=datamodule)

    timed = clock.seconds[args.warmup :]
    step = statistics.median(timed)
    device = clock.device
    result = {
        "size": args.size,
        "compile": args.compile,
        "precision": str(trainer.precision),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "parameters": module.net.num_parameters(),
        "batch": batch,
        "context": context,
        "warmup_steps": args.warmup,
        "warmup_s": sum(clock.seconds[: args.warmup]),
        "timed_steps": len(timed),
        "step_ms": 1000 * step,
        "tokens_per_s": batch * context / step,
        "flops_per_batch": module.flops_per_batch,
        "peak_flops": meter.available_flops,
        "mfu": module.flops_per_batch / step / meter.available_flops
        if meter.available_flops
        else None,
    }
    if device.type == "cuda":
        result["peak_memory_gib"] = torch.cuda.max_memory_allocated(device) / 1024**3
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="gpt2")
    parser.add_argument("--batch-size", type=int, help="default: 32 (gpt2), 8 (tiny)")
    parser.add_argument("--compile", action="store_true", help="model.compile=true")
    parser.add_argument("--precision", default="bf16-mixed")
    parser.add_argument("--steps", type=int, default=30, help="timed steps")
    parser.add_argument("--warmup", type=int, default=5, help="steps before the timed ones")
    parser.add_argument("--accelerator", default="gpu" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = parser.parse_args()

    result = measure(args)
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"lm_throughput{'_compiled' if args.compile else ''}.json"
    (args.out / name).write_text(json.dumps(result, indent=2))
    mfu = f"{100 * result['mfu']:.1f}%" if result["mfu"] is not None else "unknown (peak unknown)"
    print(
        f"{result['device']}, {result['parameters'] / 1e6:.1f}M parameters, {result['precision']}"
        f"{', compiled' if args.compile else ''}: {result['tokens_per_s']:,.0f} tokens/s, "
        f"{result['step_ms']:.1f} ms/step, MFU {mfu}; warm-up {result['warmup_s']:.1f} s "
        f"over {args.warmup} steps"
    )


if __name__ == "__main__":
    main()
