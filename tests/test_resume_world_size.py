"""A checkpoint resumes on another number of processes, mid-epoch too: the samplers save the
epoch's position (samples consumed by all processes together) and deal the rest of the epoch's
order over the processes of the resumed run, so the interrupted epoch sees every sample once."""

import csv
import functools
import json
import signal
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, open_dict
from torch.utils.data import DistributedSampler

from kindling.data.device_loader import DeviceTensorLoader
from kindling.data.loaders import ResumableDistributedSampler
from kindling.data.sequences import LengthBucketSampler
from kindling.errors import UserError
from kindling.train import run

from helpers import QUIET, TESTS, compose_in, made_once
from helpers import train_py as run_train_py

N, GLOBAL_BATCH, STEPS = 48, 8, 3  # 48 samples divide over 1, 2 and 4 processes of 8


def samplers(kind: str, world_size: int, seed: int = 5) -> list[ResumableDistributedSampler]:
    made = []
    for rank in range(world_size):
        if kind == "buckets":
            lengths = [(7 * i) % 13 for i in range(N)]
            batch = GLOBAL_BATCH // world_size
            made.append(LengthBucketSampler(range(N), world_size, rank, seed, lengths, batch))
        else:
            made.append(ResumableDistributedSampler(range(N), world_size, rank, seed))
        made[-1].set_epoch(3)
    return made


@pytest.mark.parametrize("kind", ["sampler", "buckets"])
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (2, 4), (4, 2)])
def test_a_sampler_deals_the_rest_of_the_epoch_over_the_new_processes(
    kind: str, before: int, after: int
) -> None:
    first = samplers(kind, before)
    served = [iter(sampler) for sampler in first]
    head = [next(it) for it in served for _ in range(STEPS * GLOBAL_BATCH // before)]
    state = first[0].state_dict()  # rank 0's, as Lightning saves it
    assert state["consumed"] == STEPS * GLOBAL_BATCH

    order = first[0].epoch_order()
    resumed = samplers(kind, after, seed=99)  # the seed comes from the state
    for sampler in resumed:
        sampler.load_state_dict(state)
    rest = [list(sampler) for sampler in resumed]
    assert sorted(head) == sorted(order[: STEPS * GLOBAL_BATCH])
    for rank in range(after):
        assert rest[rank] == order[STEPS * GLOBAL_BATCH + rank :: after]
    assert sorted(head + [i for part in rest for i in part]) == list(range(N))  # every sample once


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_the_sampler_deals_as_distributed_sampler_does(world_size: int) -> None:
    """11 samples: padded to an even share per process as DistributedSampler pads them."""
    for rank in range(world_size):
        ours = ResumableDistributedSampler(range(11), world_size, rank, seed=5)
        torch_s = DistributedSampler(range(11), world_size, rank, shuffle=True, seed=5)
        ours.set_epoch(2)
        torch_s.set_epoch(2)
        assert list(ours) == list(torch_s)


def test_an_older_sampler_state_resumes_on_as_many_processes() -> None:
    """Before the global position, a state counted the samples its own process served."""
    first = samplers("sampler", 2)
    served = [iter(sampler) for sampler in first]
    [next(it) for it in served for _ in range(6)]
    older = {"seed": 5, "epoch": 3, "served": 6}
    again = samplers("sampler", 2, seed=99)
    for sampler in again:
        sampler.load_state_dict(older)
    assert [list(s) for s in again] == [list(it) for it in served]


def device_loaders(world_size: int, seed: int = 1) -> list[DeviceTensorLoader]:
    labels = torch.arange(N)
    made = [
        DeviceTensorLoader(
            (labels.view(N, 1).float(), labels), GLOBAL_BATCH // world_size, shuffle=True,
            drop_last=True, rank=rank, world_size=world_size, seed=seed,
        )
        for rank in range(world_size)
    ]  # fmt: skip
    for loader in made:
        loader.set_epoch(2)
    return made


def labels_of(batches) -> list[int]:
    return [label for _, labels in batches for label in labels.tolist()]


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2), (2, 4), (4, 2)])
def test_the_device_loader_deals_the_rest_of_the_epoch_over_the_new_ranks(
    before: int, after: int
) -> None:
    first = device_loaders(before)
    whole = labels_of(batch for loader in first for batch in loader)  # every rank's epoch
    served = [iter(loader) for loader in first]
    head = labels_of(next(it) for it in served for _ in range(STEPS))
    state = first[0].state_dict()
    assert state["consumed"] == STEPS * GLOBAL_BATCH

    (alone,) = device_loaders(1)
    order = labels_of(alone)  # the epoch's permutation, as one rank serves it
    resumed = device_loaders(after, seed=7)
    for loader in resumed:
        loader.load_state_dict(state)
    rest = [labels_of(loader) for loader in resumed]
    for rank in range(after):
        assert rest[rank] == order[STEPS * GLOBAL_BATCH + rank :: after]
    assert sorted(head + [i for part in rest for i in part]) == sorted(whole) == list(range(N))

    older = device_loaders(before, seed=7)  # a state of batches served by one rank
    older[0].load_state_dict({"seed": 1, "epoch": 2, "served": STEPS})
    assert labels_of(older[0]) == labels_of(served[0])


def test_a_position_the_new_processes_cannot_share_is_refused() -> None:
    """6 samples consumed (a data.batch_size of 6 on one process) do not deal over 4."""
    (sampler,) = samplers("sampler", 1)
    served = iter(sampler)
    [next(served) for _ in range(6)]
    with pytest.raises(UserError, match=r"6 training samples into its epoch.*over 4 processes"):
        samplers("sampler", 4)[1].load_state_dict(sampler.state_dict())
    with pytest.raises(UserError, match="does not split evenly over 4 processes"):
        device_loaders(4)[0].load_state_dict({"seed": 1, "epoch": 2, "consumed": 6})


# The digits' training split: 1,280 images (data.val_fraction=0.1099 of 1,438), 10 steps of 128
# an epoch on 1 process or 2.
RUN = [
    "data.val_fraction=0.1099", "data.batch_size=128", "test=false",
    "trainer.limit_val_batches=1", "callbacks.plots=null",
    *QUIET,
]  # fmt: skip
STOP_AT = 14
# Both changes in one run of 5 epochs, stopped by SIGTERM mid-epoch twice: `first` on 1 process
# in epoch 1; resumed by `second` on 2 processes, which train a whole epoch and are stopped in
# epoch 3; resumed by `third` on 1, which trains the last epoch whole.
EPOCHS = 5
STOPPED_AT = {"first": STOP_AT, "second": 34}  # the step each part is stopped after
CHANGES = {(1, 2): ("first", "second"), (2, 1): ("second", "third")}  # (stopped, resumed)


def record(name: str) -> list[str]:
    target = "+callbacks.record._target_=record_samples.RecordEpochSamples"
    return [target, f"+callbacks.record.name={name}"]


def stop(step: int) -> list[str]:
    return ["+callbacks.stop._target_=record_samples.SigtermAtStep", f"+callbacks.stop.step={step}"]


def train_py(folder: Path, devices: int, *args: str) -> int:
    """`python train.py` on `devices` CPU processes in the run folder `folder`: its exit code."""
    result = run_train_py(
        "trainer.accelerator=cpu", f"trainer.devices={devices}", *RUN, *args,
        f"hydra.run.dir={folder}",
        cwd=folder.parent, module_dir=TESTS, timeout=300,
    )  # fmt: skip
    assert result.returncode in (0, 128 + signal.SIGTERM), (result.stdout + result.stderr)[-4000:]
    return result.returncode


def train_here(compose: Callable[..., DictConfig], folder: Path, *args: str) -> int:
    """`kindling.train.run` in this process, on one CPU process: its exit code."""
    cfg = compose("trainer=cpu", *RUN, *args)
    with open_dict(cfg):
        cfg.paths.output_dir = str(folder)
    try:
        run(cfg)
    except SystemExit as stopped:
        return stopped.code
    return 0


def epoch_samples(folder: Path, epoch: int, launch: str = "*") -> Counter:
    """The digests of what `launch` (a record's name, "*": all) trained on in `epoch`."""
    seen = Counter()
    for path in folder.glob(f"{launch}_rank*.json"):
        seen.update(json.loads(path.read_text()).get(str(epoch), []))
    return seen


def assert_resumed_exactly(
    folder: Path, epochs: int = 3, stopped: str = "first", resumed: str = "resumed", epoch: int = 1
) -> None:
    """`stopped` began `epoch`, `resumed` trained the rest of it: no step and no sample lost or
    repeated."""
    checkpoint = torch.load(folder / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["global_step"] == 10 * epochs  # 10 steps an epoch: none lost or repeated
    whole = epoch_samples(folder, 0)  # an epoch the first launch trained from end to end
    assert sum(whole.values()) == 1280
    # The interrupted epoch: each image of the training split once, over both launches; and
    # the epochs after it, whole.
    for later in range(1, epochs):
        assert epoch_samples(folder, later) == whole, later
    assert epoch_samples(folder, epoch, stopped) and epoch_samples(folder, epoch, resumed)
    with open(folder / "csv" / "metrics.csv") as f:
        val = {int(r["epoch"]): float(r["val/loss"]) for r in csv.DictReader(f) if r["val/loss"]}
    assert sorted(val) == list(range(epochs))
    assert val[epochs - 1] < val[0]  # the resumed run went on learning


LOADERS = {"dataloader": [], "on device": ["data.on_device=true"]}  # the two samplers


def stopped_and_resumed_twice(folder: Path, loader: str) -> dict:
    """The run of CHANGES on `loader` in `folder/run`: each part's exit code, and where each stop
    left last.ckpt (its epoch and step)."""
    run_dir = folder / "run"
    checkpoint = run_dir / "checkpoints" / "last.ckpt"
    compose = functools.partial(compose_in, folder)
    common = [*LOADERS[loader], f"trainer.max_epochs={EPOCHS}"]
    resume = f"ckpt_path={checkpoint}"

    def position() -> dict[str, int]:
        saved = torch.load(checkpoint, weights_only=True)
        return {"epoch": saved["epoch"], "global_step": saved["global_step"]}

    first = [*record("first"), *stop(STOPPED_AT["first"])]
    codes, stopped = [train_here(compose, run_dir, *common, *first)], {"first": position()}
    second = [*record("second"), *stop(STOPPED_AT["second"]), resume]
    codes.append(train_py(run_dir, 2, *common, *second))
    stopped["second"] = position()
    codes.append(train_here(compose, run_dir, *common, *record("third"), resume))
    GlobalHydra.instance().clear()
    return {"codes": codes, "stopped": stopped}


@pytest.fixture(scope="session")
def stopped_and_resumed(tmp_path_factory) -> Callable[[str], tuple[Path, dict]]:
    """`(loader)`: the run folder of CHANGES on that loader, made once per session, and what
    stopped_and_resumed_twice returned."""

    @functools.cache
    def made(loader: str) -> tuple[Path, dict]:
        make = functools.partial(stopped_and_resumed_twice, loader=loader)
        name = f"world_size_changes_{loader.replace(' ', '_')}"
        folder, result = made_once(tmp_path_factory, name, make)
        return folder / "run", result

    return made


@pytest.mark.slow
@pytest.mark.parametrize("loader", LOADERS)
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 2)])
def test_a_run_stopped_mid_epoch_resumes_on_another_number_of_processes(
    stopped_and_resumed, before: int, after: int, loader: str
) -> None:
    folder, made = stopped_and_resumed(loader)
    assert made["codes"] == [128 + signal.SIGTERM, 128 + signal.SIGTERM, 0]
    stopped, resumed = CHANGES[before, after]
    epoch, position = STOPPED_AT[stopped] // 10, made["stopped"][stopped]
    assert position["epoch"] == epoch
    assert 10 * epoch < position["global_step"] < 10 * (epoch + 1)  # mid-epoch
    assert_resumed_exactly(folder, EPOCHS, stopped, resumed, epoch)
    # After the interrupted epoch, a whole one on the resumed run's processes alone.
    assert epoch_samples(folder, epoch + 1, resumed) == epoch_samples(folder, 0)


@pytest.mark.slow
def test_a_run_resumed_with_fewer_loader_workers_sees_the_rest_of_its_epoch(
    compose_config, tmp_path: Path
) -> None:
    """data.num_workers=null gives each process a share of the machine's CPUs, so another
    number of processes has another number of workers, whose state torchdata refuses."""
    folder, two_epochs = tmp_path / "run", "trainer.max_epochs=2"
    first = ["data.num_workers=2", two_epochs, *record("first"), *stop(STOP_AT)]
    assert train_here(compose_config, folder, *first) == 128 + signal.SIGTERM
    checkpoint = folder / "checkpoints" / "last.ckpt"
    then = ["data.num_workers=1", two_epochs, *record("resumed"), f"ckpt_path={checkpoint}"]
    assert train_here(compose_config, folder, *then) == 0
    assert_resumed_exactly(folder, epochs=2)
