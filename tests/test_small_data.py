"""Kindling's defaults on a set nobody tuned them to: few, long sequences of one channel."""

import csv
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DistributedSampler

from kindling.data.loaders import ResumableDistributedSampler
from kindling.data.sequences import LengthBucketSampler
from kindling.models.recurrent import GRUClassifier
from kindling.train import run

from helpers import QUIET

SHAPE = np.linspace(0.0, 1.0, 40)
SHAPES = {
    "inverted_sine": -np.sin(2 * np.pi * SHAPE),
    "sine": np.sin(2 * np.pi * SHAPE),
    "triangle": 1.0 - np.abs(2.0 * SHAPE - 1.0),
    "square": np.full(40, 0.5),
}


def shapes(count: int, lengths: tuple[int, int], seed: int) -> list[tuple[np.ndarray, int]]:
    """`count` sequences of one noisy channel, each holding one 40-step shape at a random step:
    a sine period, the same upside down, a triangle or a square pulse (the class, chance 1/4)."""
    rng = np.random.default_rng(seed)
    sequences = []
    for number in range(count):
        label = number % len(SHAPES)
        x = rng.normal(0.0, 0.3, int(rng.integers(*lengths, endpoint=True)))
        start = int(rng.integers(0, len(x) - 40))
        x[start : start + 40] += 1.5 * list(SHAPES.values())[label]
        sequences.append((x, label))
    return sequences


def shapes_table(path: Path, train: int = 50, test: int = 100, seed: int = 0) -> Path:
    """`shapes` of 60-80 steps, 50 train sequences, as many of the archive's small sets have;
    the table's `split` gives the test. Without data.min_epoch_size's floor they test 0.85 (at
    120-160 steps 0.86, for twice the time); at 45-60 steps a few optimizer steps learn them."""
    with open(path, "w", newline="") as f:
        table = csv.writer(f)
        table.writerow(["id", "time", "label", "split", "x"])
        for number, (x, label) in enumerate(shapes(train + test, (60, 80), seed)):
            split = "train" if number < train else "test"
            rows = ([number, t, list(SHAPES)[label], split, f"{v:.4f}"] for t, v in enumerate(x))
            table.writerows(rows)
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


def padded(sequences: list[tuple[np.ndarray, int]]) -> tuple[torch.Tensor, ...]:
    """Steps `(B, T, 1)` zero-padded, lengths, labels."""
    steps = torch.zeros(len(sequences), max(len(x) for x, _ in sequences), 1)
    for i, (x, _) in enumerate(sequences):
        steps[i, : len(x), 0] = torch.from_numpy(x)
    lengths = torch.tensor([len(x) for x, _ in sequences])
    return steps, lengths, torch.tensor([label for _, label in sequences])


@pytest.mark.slow
def test_a_conv_stem_learns_long_sequences_that_a_recurrent_net_does_not() -> None:
    """Shapes in 150-225 steps: a one-layer GRU that reads them in patches of 5 steps (its
    default here) learns them in 80 optimizer steps (0.99); read step by step, the same net
    does not (0.43)."""
    train, test = padded(shapes(200, (150, 225), seed=0)), padded(shapes(100, (150, 225), seed=1))
    accuracies = {}
    for patch in (None, 1):
        torch.manual_seed(0)
        net = GRUClassifier(
            None, 4, hidden_size=32, num_features=1, longest_sequence=225, patch_length=patch,
            bidirectional=True, num_layers=1,
        )  # fmt: skip
        assert (net.stem is None) == (patch == 1)
        optimizer = torch.optim.Adam(net.parameters(), lr=1e-2)
        batches = torch.Generator().manual_seed(0)
        for _ in range(80):
            at = torch.randint(0, 200, (32,), generator=batches)
            loss = F.cross_entropy(net(train[0][at], train[1][at]), train[2][at])
            optimizer.zero_grad(), loss.backward(), optimizer.step()
        with torch.no_grad():
            logits = net.eval()(test[0], test[1])
        accuracies[patch] = (logits.argmax(1) == test[2]).float().mean().item()
    assert accuracies[None] >= 0.9 and accuracies[1] < 0.6, accuracies


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
