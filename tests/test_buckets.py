"""data.bucket=true: training batches of similar lengths, each epoch a fair draw of the set."""

import itertools
from pathlib import Path

import torch

from kindling.data.sequences import LengthBucketSampler

from helpers import data_module, pattern_rows, write_table

LENGTHS = torch.randint(5, 51, (103,), generator=torch.Generator().manual_seed(0)).tolist()


def sampler(replicas: int = 1, rank: int = 0, epoch: int = 0) -> LengthBucketSampler:
    made = LengthBucketSampler(range(103), replicas, rank, 7, LENGTHS, batch_size=8, pool_batches=4)
    made.set_epoch(epoch)
    return made


def padding(order: list[int], batch_size: int = 8) -> float:
    """The share of padded steps when `order` is cut into batches padded to their longest."""
    batches = [torch.tensor([LENGTHS[i] for i in order[s : s + batch_size]])
               for s in range(0, len(order), batch_size)]  # fmt: skip
    return 1 - sum(int(b.sum()) for b in batches) / sum(len(b) * int(b.max()) for b in batches)


def test_every_epoch_serves_each_sample_once_in_a_new_order_with_less_padding() -> None:
    first, second = list(sampler(epoch=0)), list(sampler(epoch=1))
    assert sorted(first) == sorted(second) == list(range(103))
    assert first != second and first == list(sampler(epoch=0))  # seeded
    shuffled = torch.randperm(103, generator=torch.Generator().manual_seed(1)).tolist()
    assert padding(first) < padding(shuffled) / 2
    # The batches' order is drawn too: over five epochs, a batch is longer than the one before
    # about half the time (27 of 55), not whenever a pool's batches follow in sorted order (45).
    growing = 0
    for epoch in range(5):
        order = list(sampler(epoch=epoch))
        longest = [max(LENGTHS[i] for i in order[s : s + 8]) for s in range(0, 96, 8)]
        growing += sum(b > a for a, b in itertools.pairwise(longest))
    assert growing < 36


def test_two_processes_share_an_epoch_batch_by_batch() -> None:
    ranks = [list(sampler(replicas=2, rank=rank)) for rank in (0, 1)]
    assert len(ranks[0]) == len(ranks[1]) == 52  # 103 padded to an even 104, as DDP does
    assert set(ranks[0]) | set(ranks[1]) == set(range(103))
    assert len(set(ranks[0]) & set(ranks[1])) <= 1  # the one repeated to even the shares
    # Step by step, both processes' batches come from one global batch: similar lengths.
    for start in range(0, 48, 8):
        batches = [[LENGTHS[i] for i in rank[start : start + 8]] for rank in ranks]
        assert max(map(max, batches)) - min(map(min, batches)) <= 25


def test_a_resumed_sampler_serves_the_rest_of_the_epoch() -> None:
    served = sampler(epoch=3)
    stream = iter(served)
    head = [next(stream) for _ in range(37)]
    resumed = sampler()  # a fresh process: epoch and position come from the state
    resumed.load_state_dict(served.state_dict())
    resumed.set_epoch(3)
    assert head + list(resumed) == list(sampler(epoch=3))


def test_the_data_module_buckets_its_training_batches(tmp_path: Path) -> None:
    table = write_table(pattern_rows(200, seed=4), tmp_path / "table.csv")
    plain, bucketed = (data_module(table, batch_size=8, bucket=b) for b in (False, True))
    assert isinstance(bucketed.train_dataloader().sampler, LengthBucketSampler)

    def padded_share(module) -> float:
        real = total = 0
        for steps, lengths, _ in module.train_dataloader():
            real, total = real + int(lengths.sum()), total + steps.shape[0] * steps.shape[1]
        return 1 - real / total

    assert padded_share(bucketed) < padded_share(plain) / 3
    assert sum(len(b[2]) for b in bucketed.train_dataloader()) == len(bucketed.data_train)


def test_every_process_gets_its_share_when_the_set_is_smaller_than_the_processes() -> None:
    # One sample on four processes: each serves it once, as DistributedSampler pads; a process
    # that served nothing would run fewer steps than the others and leave them waiting.
    shares = [
        list(LengthBucketSampler(range(1), 4, rank, 7, [5], batch_size=2)) for rank in range(4)
    ]
    assert shares == [[0], [0], [0], [0]]
