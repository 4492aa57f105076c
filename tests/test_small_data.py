"""Kindling's defaults on a set nobody tuned them to: few, long sequences of one channel."""

import csv
from pathlib import Path

import numpy as np
import pytest
from torch.utils.data import DistributedSampler

from kindling.data.buckets import LengthBucketSampler
from kindling.data.loaders import ResumableDistributedSampler
from kindling.train import run

from helpers import QUIET


def shapes_table(path: Path, train: int = 50, test: int = 100, seed: int = 0) -> Path:
    """Sequences of 200-300 steps of one noisy channel, each holding one 40-step shape at a
    random step: a sine period, the same upside down, a triangle or a square pulse (the
    class, chance 1/4). 50 train sequences, as many of the archive's small sets have; the
    table's `split` gives the test."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0.0, 1.0, 40)
    shapes = {
        "inverted_sine": -np.sin(2 * np.pi * ramp),
        "sine": np.sin(2 * np.pi * ramp),
        "triangle": 1.0 - np.abs(2.0 * ramp - 1.0),
        "square": np.full(40, 0.5),
    }
    with open(path, "w", newline="") as f:
        table = csv.writer(f)
        table.writerow(["id", "time", "label", "split", "x"])
        for number in range(train + test):
            label = list(shapes)[number % len(shapes)]
            x = rng.normal(0.0, 0.3, int(rng.integers(200, 300, endpoint=True)))
            start = int(rng.integers(0, len(x) - 40))
            x[start : start + 40] += 1.5 * shapes[label]
            split = "train" if number < train else "test"
            table.writerows([number, t, label, split, f"{v:.4f}"] for t, v in enumerate(x))
    return path


@pytest.mark.slow
def test_the_recommended_recipe_learns_fifty_long_sequences(compose_config, tmp_path: Path) -> None:
    """README's sequence recipe with every other value kindling's default: a default that spends
    a few optimizer steps, or tests what a handful of validation sequences chose, fails here."""
    table = shapes_table(tmp_path / "shapes.csv")
    cfg = compose_config("data=sequences", f"data.path={table}", "model=temporal_conv", *QUIET)
    run(cfg)
    with open(Path(cfg.paths.output_dir) / "csv" / "metrics.csv") as f:
        (tested,) = [row for row in csv.DictReader(f) if row.get("test/acc")]
    assert float(tested["test/acc"]) >= 0.9


@pytest.mark.parametrize("bucket", [False, True])
def test_an_epoch_serves_a_small_set_several_times_over(bucket: bool) -> None:
    """`passes` (data.min_epoch_size): every sample as often, each pass its own order, dealt
    over the processes as one epoch is."""
    lengths = list(range(10))
    samplers = [
        LengthBucketSampler(range(10), 2, rank, 3, lengths, 4, 32, passes=3)
        if bucket
        else ResumableDistributedSampler(range(10), 2, rank, 3, passes=3)
        for rank in (0, 1)
    ]
    served = [list(sampler) for sampler in samplers]
    assert len(served[0]) == len(served[1]) == len(samplers[0]) == 15
    assert sorted(served[0] + served[1]) == sorted(lengths * 3)
    if not bucket:  # (buckets sort each pool by length)
        order = samplers[0].epoch_order()
        assert sorted(order[:10]) == lengths and order[:10] != order[10:20]


def test_one_pass_is_distributed_samplers_own_order() -> None:
    """Without data.min_epoch_size (the image sets), epochs are what they were."""
    for rank in (0, 1):
        ours = ResumableDistributedSampler(range(11), 2, rank, seed=3)
        torchs = DistributedSampler(range(11), 2, rank, shuffle=True, seed=3)
        ours.set_epoch(4), torchs.set_epoch(4)
        assert list(ours) == list(torchs)
