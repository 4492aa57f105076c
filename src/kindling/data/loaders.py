"""What every kindling data module shares: a global batch size, its checks, its train/val/test
split (seeded, stratified where asked, or k-fold), its DataLoaders."""

import functools
import inspect
import itertools
import math
import os
from collections.abc import Iterator
from typing import Any

import lightning as L
import torch
from lightning.pytorch.accelerators import CUDAAccelerator
from lightning.pytorch.overrides.distributed import UnrepeatedDistributedSampler
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Sampler
from torchdata.stateful_dataloader import StatefulDataLoader

from kindling.errors import UserError

SPLITS = ("train", "val", "test")
PREDICT_SPLITS = ("test", "val")  # the splits `python -m kindling.predict input=` names


def per_device_batch_size(batch_size: int, world_size: int) -> int:
    """Split a global batch size evenly over `world_size` processes."""
    if batch_size <= 0:
        raise UserError(f"data.batch_size must be a positive integer, got {batch_size}.")
    if batch_size % world_size:
        raise UserError(
            f"data.batch_size={batch_size} is the global batch size and must divide evenly over "
            f"{world_size} processes. Use a multiple of {world_size}, "
            f"e.g. data.batch_size={max(world_size, batch_size // world_size * world_size)}."
        )
    return batch_size // world_size


def split_off(
    labels: torch.Tensor,
    fraction: float,
    seed: int,
    *,
    folds: int | None = None,
    fold: int | None = None,
    stratify: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(rest, held out)` indices into `labels`, each ascending: fold `fold` of `folds` when
    given (`fold_split`), else a seeded `fraction` of the samples (at least one); `stratify`
    keeps each class's share, as fold 0 of `round(1 / fraction)` folds does."""
    count = len(labels)
    if folds is not None or stratify:
        from kindling.data.folds import fold_split

        if folds is None:
            folds, fold = max(2, min(round(1 / fraction), count)), 0
        return fold_split(labels, folds, fold, seed)
    held = max(1, round(count * fraction))
    if held >= count:
        raise UserError(
            f"Only {count} training samples: too few to hold out {fraction:.0%} of them. Add "
            "samples, or give the split of your own."
        )
    order = torch.randperm(count, generator=torch.Generator().manual_seed(seed))
    return order[held:].sort().values, order[:held].sort().values


class EpochPosition:
    """Where an epoch stands, saved in checkpoints: the samples of it that all processes took
    together. A run resumed from it serves the rest of that epoch, in the same order, dealt over
    the processes it has, as many as the saving run's or not. `served_unit`: the samples an
    older checkpoint's `served` (this process's count) stands for."""

    consumed = 0
    _resume_at: tuple[int, int] | None = None  # (epoch, consumed) of a loaded state

    def start(self) -> int:  # a loaded position of this epoch, else its beginning
        resume, self._resume_at = self._resume_at, None
        self.consumed = resume[1] if resume is not None and resume[0] == self.epoch else 0
        return self.consumed

    def state_dict(self) -> dict[str, int]:
        return {"seed": self.seed, "epoch": self.epoch, "consumed": self.consumed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.seed = state["seed"]
        consumed = state["consumed"] if "consumed" in state else state["served"] * self.served_unit
        # Dealt one each in turn, the rest of the epoch splits evenly only from such a position;
        # processes would otherwise run different numbers of steps.
        if consumed % self.processes:
            raise UserError(
                f"The checkpoint stopped {consumed} training samples into its epoch, which does "
                f"not split evenly over {self.processes} processes: resume on a number of "
                f"processes that divides {consumed}, or from a checkpoint written at the end of "
                "an epoch."
            )
        self._resume_at = (state["epoch"], consumed)


class ResumableDistributedSampler(EpochPosition, DistributedSampler):
    """`DistributedSampler`'s permutation of each epoch, this process's share of it, and where
    the epoch stands (`EpochPosition`), which torchdata's `StatefulDataLoader` saves in every
    checkpoint. `passes`: an epoch of that many permutations of a small set."""

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int, passes: int = 1):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed)
        self.passes = passes
        self.num_samples = math.ceil(passes * len(dataset) / num_replicas)
        self.total_size = self.num_samples * num_replicas
        self.processes = self.served_unit = num_replicas

    def __iter__(self) -> Iterator[int]:
        start = self.start()
        # Dealt one each in turn: when every process has served k samples, the processes have
        # consumed the first start + k * num_replicas of the epoch's order.
        for index in self.epoch_order()[start + self.rank :: self.num_replicas]:
            self.consumed += self.num_replicas
            yield index

    def epoch_order(self) -> list[int]:
        """The epoch's samples for all processes, in the order dealt, padded as
        `DistributedSampler` pads to `total_size` (a subclass may reorder them)."""
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = self.shuffled(generator)
        return order + list(itertools.islice(itertools.cycle(order), self.total_size - len(order)))

    def shuffled(self, generator: torch.Generator) -> list[int]:
        """`passes` permutations of the set, one after another."""
        perms = [torch.randperm(len(self.dataset), generator=generator) for _ in range(self.passes)]
        return torch.cat(perms).tolist()


class SplitDataModule(L.LightningDataModule):
    """Serves `data_train`, `data_val` and `data_test`, which a subclass's `setup_splits` sets,
    with the hyperparameters the data configs share. `fixed_batch_shapes`: False where batches
    vary in shape (padded sequences); the trainer times cuDNN's algorithms only when they do not.

    `predict_input` (kindling.predict's `input=`) is a split, "test" or "val", or a path of new
    inputs, which `inputs_to_predict` reads: batches `[*inputs, rows, readable]`, `rows`
    indexing `predict_names`, `readable` False where an input cannot be read.
    """

    data_train: Dataset | None = None
    data_val: Dataset | None = None
    data_test: Dataset | None = None
    fixed_batch_shapes: bool = True
    predict_input: str = "test"
    data_predict: Dataset | None = None
    names_to_predict: list[str] | None = None

    def save_hyperparameters(self, *args: Any, **kwargs: Any) -> None:
        # Lightning's, of the caller's arguments; then the keys data modules share are checked,
        # at construction, before any data is read.
        kwargs.setdefault("logger", False)
        super().save_hyperparameters(*args, frame=inspect.currentframe().f_back, **kwargs)
        hp = self.hparams
        per_device_batch_size(hp.batch_size, 1)
        if "val_fraction" in hp and not 0.0 < hp.val_fraction < 1.0:
            raise UserError(f"data.val_fraction must be between 0 and 1, got {hp.val_fraction}.")
        if hp.get("folds") is not None or hp.get("fold") is not None:
            from kindling.data.folds import check_folds

            check_folds(hp.get("folds"), hp.get("fold"))

    def setup(self, stage: str | None = None) -> None:
        if stage == "predict" and self.predict_input not in PREDICT_SPLITS:
            self.data_predict, self.names_to_predict = self.inputs_to_predict(self.predict_input)
        elif self.data_train is None:
            self.batch_size_per_device  # noqa: B018 - validate before reading any data
            self.setup_splits()

    def setup_splits(self) -> None:
        raise NotImplementedError  # sets data_train, data_val and data_test

    def inputs_to_predict(self, path: str) -> tuple[Dataset, list[str]]:
        raise UserError(f"input={path}: {type(self).__name__} predicts its test or val split only.")

    @property
    def batch_size_per_device(self) -> int:
        world_size = self.trainer.world_size if self.trainer is not None else 1
        return per_device_batch_size(self.hparams.batch_size, world_size)

    @property
    def shuffle_seed(self) -> int:
        """`shuffle_seed`, else the run's seed (`seed_everything` sets PL_GLOBAL_SEED), else one
        drawn (the same on every rank)."""
        seed = self.hparams.get("shuffle_seed")
        if seed is None and os.environ.get("PL_GLOBAL_SEED") is not None:
            seed = int(os.environ["PL_GLOBAL_SEED"])
        if seed is None:
            seed = int(torch.randint(2**31, ()))
            if self.trainer is not None:
                seed = self.trainer.strategy.broadcast(seed)
        return seed

    @property
    def num_workers(self) -> int:
        if self.hparams.num_workers is not None:
            return self.hparams.num_workers
        from kindling.data.workers import default_num_workers

        return default_num_workers(self.trainer.num_devices if self.trainer is not None else 1)

    def training_sampler(
        self, dataset: Dataset, world_size: int, rank: int, seed: int
    ) -> ResumableDistributedSampler:
        """The order of training samples (a data module may batch similar samples together)."""
        return ResumableDistributedSampler(
            dataset, world_size, rank, seed, self.epoch_passes(dataset)
        )

    def epoch_passes(self, dataset: Dataset) -> int:
        """Enough passes over the training split for `min_epoch_size` samples: 50 sequences in
        batches of 32 are 2 steps an epoch, on which early stopping's patience and the validation
        cadence, counted in epochs, would hang."""
        return max(1, math.ceil((self.hparams.get("min_epoch_size") or 0) / len(dataset)))

    def _loader(
        self,
        dataset: Dataset | None,
        shuffle: bool = False,
        sampler: Sampler | None = None,
        drop_last: bool = False,
    ) -> DataLoader:
        if dataset is None:
            raise RuntimeError("call setup() before asking for a data loader")
        world_size = self.trainer.world_size if self.trainer is not None else 1
        rank = self.trainer.global_rank if self.trainer is not None else 0
        generator = None
        if shuffle:
            # Lightning keeps a DistributedSampler it is given (and calls its set_epoch). Shifted:
            # seed 1's second epoch is not seed 2's first (the sampler adds the epoch).
            seed = self.shuffle_seed << 20
            sampler, shuffle = self.training_sampler(dataset, world_size, rank, seed), False
            # Worker seeds from the loader's own generator: a resumed run's dropout draws do not
            # depend on when its loaders were made.
            generator = torch.Generator().manual_seed(sampler.seed)
        if sampler is None and world_size > 1:
            # Evaluation sees every sample once; the ranks' batch counts may differ by one, which
            # is safe: no evaluation step waits for the others (Lightning's sampler repeats).
            sampler = UnrepeatedDistributedSampler(
                dataset, num_replicas=world_size, rank=rank, shuffle=False
            )
        options = self.loader_options(dataset, drop_last)
        if options["num_workers"] > 0:
            from kindling.data.workers import leave_stop_signals_to_the_main_process

            options["worker_init_fn"] = functools.partial(
                leave_stop_signals_to_the_main_process, rank=rank
            )
        # torchdata's loader saves its position (sampler, workers) in Lightning's checkpoints.
        return StatefulDataLoader(
            dataset, shuffle=shuffle, sampler=sampler, generator=generator, **options
        )

    def loader_options(self, dataset: Dataset, drop_last: bool) -> dict:
        """What every loader shares (kindling.data.streaming's too)."""
        on_cuda = self.trainer is not None and isinstance(self.trainer.accelerator, CUDAAccelerator)
        workers = self.num_workers
        if workers > 0 and self.trainer is not None and self.trainer.world_size > 1:
            from kindling.data.workers import warn_if_workers_can_hang

            warn_if_workers_can_hang()
        return {
            "batch_size": self.batch_size_per_device,
            "num_workers": workers,
            "pin_memory": self.hparams.pin_memory and on_cuda,
            "persistent_workers": self.hparams.get("persistent_workers", False) and workers > 0,
            "prefetch_factor": self.hparams.get("prefetch_factor") if workers > 0 else None,
            "drop_last": drop_last,
            # A data set whose samples do not stack (encoded files, sequences) brings its own.
            "collate_fn": getattr(dataset, "collate", None),
        }

    def train_dataloader(self) -> DataLoader:
        # A last partial batch gives BatchNorm a tiny batch and torch.compile a new shape; kept
        # when the whole split is smaller than one global batch (no batch at all otherwise).
        drop = self.hparams.get("drop_last", False)
        if drop and len(self.data_train or ()) < self.hparams.batch_size:
            drop = False
        return self._loader(self.data_train, shuffle=True, drop_last=drop)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.data_val)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.data_test)

    def predict_dataloader(self) -> DataLoader:
        split = self.predict_input in PREDICT_SPLITS
        return self._loader(
            getattr(self, f"data_{self.predict_input}") if split else self.data_predict
        )

    @property
    def predict_names(self) -> list[str]:
        """Each row's name: a file, a sequence id, or (in-memory splits) an index."""
        if self.predict_input not in PREDICT_SPLITS:
            return self.names_to_predict
        split = getattr(self, f"data_{self.predict_input}")
        names = [file for file, _ in getattr(split, "samples", [])] or getattr(split, "ids", None)
        return [str(name) for name in (range(len(split)) if names is None else names)]
