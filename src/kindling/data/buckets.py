"""Batches of similar lengths: less padding; each epoch still a fair random draw of the set."""

from collections.abc import Sequence

import torch
from torch.utils.data import Dataset

from kindling.data.loaders import ResumableDistributedSampler


class LengthBucketSampler(ResumableDistributedSampler):
    """`ResumableDistributedSampler`'s epochs (every sample as often, seeded, this process's share,
    resumable mid-epoch), served in batches of similar lengths.

    Each epoch: a seeded permutation of the whole set (padded to an even share per process, as
    DistributedSampler does) is cut into pools of `pool_batches` global batches; a pool is sorted
    by length and cut into global batches, whose order is shuffled; each global batch is dealt
    to the processes in turn, so every process gets `batch_size` samples of about one length per
    step. The DataLoader's batches (of `batch_size`) are these, one after another.

    The order depends on the number of processes only through the padding (data.batch_size is
    global): a run resumed on another number serves exactly the rest of the epoch when the set
    divides evenly by both.
    """

    def __init__(
        self,
        dataset: Dataset,
        num_replicas: int,
        rank: int,
        seed: int,
        lengths: Sequence[int],
        batch_size: int,
        pool_batches: int = 32,
        passes: int = 1,
    ):
        super().__init__(dataset, num_replicas, rank, seed, passes)
        self.lengths = torch.as_tensor(lengths)
        self.batch_size = batch_size
        self.pool_batches = pool_batches

    def epoch_order(self) -> list[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.tensor(self.shuffled(generator))
        order = torch.cat([order, order[: self.total_size - len(order)]])  # an even share each
        global_batch = self.batch_size * self.num_replicas
        pool = global_batch * self.pool_batches
        batches = []
        for start in range(0, len(order), pool):
            members = order[start : start + pool]
            by_length = members[torch.sort(self.lengths[members], stable=True).indices]
            batches += list(torch.split(by_length, global_batch))
        # A last, short global batch stays last: each process's batches keep their boundaries.
        full = [b for b in batches if len(b) == global_batch]
        short = [b for b in batches if len(b) < global_batch]
        shuffled = [full[i] for i in torch.randperm(len(full), generator=generator).tolist()]
        # Dealt one each in turn, each global batch (a multiple of the processes) gives every
        # process `batch_size` of its samples.
        return [index for batch in (*shuffled, *short) for index in batch.tolist()]
