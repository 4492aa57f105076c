"""Samples per second of the in-memory data sets' DataLoader: before (a TensorDataset, one
`__getitem__` per sample and a collate that stacks them, through worker processes) and now
(`BatchIndexedTensors`: one index per batch, in the main process), on the same data.

    python benchmarks/inmemory_loader.py --samples 60000 --workers 2 --repeats 5

The data: `--samples` random float images of `--shape` (MNIST's 1x28x28 by default) with int64
labels, in memory. Both sides shuffle with the sampler kindling trains with and batch
`--batch-size` samples; before: `TensorDataset` + `DataLoader(num_workers=--workers,
persistent_workers=True)` (MNIST's old defaults; pinned memory only matters on CUDA and is off
on both sides); now: kindling's `MNISTDataModule._loader` path, `BatchIndexedTensors` with
`num_workers=0` (kindling's default), and also with `--workers` workers ("now, workers"): on a
machine whose cores are busy with training, workers can still hide the indexing. Each side is
timed over one full epoch, after a warm-up epoch that starts its workers; the sides alternate,
`--repeats` times, in one process, so load on the machine slows both alike. Prints the median
samples/s of each side and their ratios to before.
"""

import argparse
import statistics
import time

import torch
from torch.utils.data import TensorDataset
from torchdata.stateful_dataloader import StatefulDataLoader

from kindling.data.in_memory import BatchIndexedTensors
from kindling.data.loaders import ResumableDistributedSampler


def loader(dataset, batch_size: int, workers: int) -> StatefulDataLoader:
    return StatefulDataLoader(
        dataset,
        batch_size=batch_size,
        sampler=ResumableDistributedSampler(dataset, num_replicas=1, rank=0, seed=0),
        num_workers=workers,
        persistent_workers=workers > 0,
        collate_fn=getattr(dataset, "collate", None),
    )


def samples_per_second(batches, epoch: int) -> float:
    batches.sampler.set_epoch(epoch)
    count, start = 0, time.perf_counter()
    for images, _labels in batches:
        count += len(images)
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=60_000)
    parser.add_argument("--shape", type=int, nargs="+", default=[1, 28, 28])
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--workers", type=int, default=2, help="workers of the old path")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()

    images = torch.rand(args.samples, *args.shape)
    labels = torch.randint(10, (args.samples,))
    sides = {
        "before": loader(TensorDataset(images, labels), args.batch_size, args.workers),
        "now": loader(BatchIndexedTensors(images, labels), args.batch_size, 0),
        "now, workers": loader(BatchIndexedTensors(images, labels), args.batch_size, args.workers),
    }
    rates: dict[str, list[float]] = {name: [] for name in sides}
    for batches in sides.values():
        samples_per_second(batches, epoch=0)  # warm-up: workers start
    for repeat in range(args.repeats):
        for name, batches in sides.items():
            rates[name].append(samples_per_second(batches, epoch=repeat + 1))

    shape = "x".join(map(str, args.shape))
    print(
        f"{args.samples} samples of {shape}, batch {args.batch_size}, {args.repeats} repeats; "
        f"before: TensorDataset, {args.workers} workers; now: BatchIndexedTensors, no workers"
    )
    for name, values in rates.items():
        print(f"{name:>12}: {statistics.median(values):12,.0f} samples/s (median)")
    for name in ("now", "now, workers"):
        ratio = statistics.median(rates[name]) / statistics.median(rates["before"])
        print(f"{name} / before: {ratio:.2f}x")


if __name__ == "__main__":
    main()
