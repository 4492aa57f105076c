"""A run stopped mid-epoch and resumed ends where an uninterrupted run ends: same val/loss, same
weights, for every way batches are served (DataLoader with and without workers, on the device,
image folders) and every way a run stops (SIGTERM, a step checkpoint). A run resumed on another
device, whose batches come another way, goes on learning."""

import csv
import os
import signal
from pathlib import Path

import lightning as L
import numpy as np
import pytest
import torch
from PIL import Image

import kindling.train
from kindling.config.instantiate import instantiate_group
from kindling.data.device_loader import DeviceTensorLoader
from kindling.data.loaders import ResumableDistributedSampler
from kindling.train import run

from helpers import ON_GPU, QUIET, in_folder

# Two epochs of 6 steps; the interrupted run stops at step 9, in the middle of the second.
SHORT = [
    "trainer=cpu", "trainer.deterministic=true", "seed=3", "test=false", "trainer.max_epochs=2",
    "trainer.limit_train_batches=6", "trainer.limit_val_batches=2", "data.batch_size=16",
    "callbacks.plots=null", *QUIET,
]  # fmt: skip
STOP_AT = 9


class SigtermAtStep(L.Callback):
    """Sends this process SIGTERM after training step `step`, as a cluster pre-empting it does."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGTERM)


class SaveFinalWeights(L.Callback):
    """Writes the weights training ended with (last.ckpt may be older: it follows val/acc)."""

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        torch.save(pl_module.state_dict(), Path(trainer.default_root_dir) / "final.pt")


def adding(monkeypatch, *callbacks: L.Callback) -> None:
    """Runs built by `kindling.train.run` get `callbacks` besides their configured ones."""
    monkeypatch.setattr(
        kindling.train, "instantiate_group",
        lambda config, group: [*instantiate_group(config, group), *callbacks]
        if group == "callbacks" else instantiate_group(config, group),
    )  # fmt: skip


def last_val_loss(folder: Path) -> float:
    with open(folder / "csv" / "metrics.csv") as f:
        return float([r["val/loss"] for r in csv.DictReader(f) if r["val/loss"]][-1])


def weights(folder: Path) -> dict[str, torch.Tensor]:
    return torch.load(folder / "final.pt", weights_only=True)


def assert_same_run(straight: Path, resumed: Path) -> None:
    assert last_val_loss(resumed) == pytest.approx(last_val_loss(straight), abs=1e-6)
    expected, found = weights(straight), weights(resumed)
    for key, tensor in expected.items():
        torch.testing.assert_close(found[key], tensor, rtol=0, atol=1e-6, msg=key)


def stopped_and_resumed(compose_config, tmp_path: Path, monkeypatch, *overrides: str) -> Path:
    """Train with SIGTERM at step STOP_AT, then resume from the interrupt's last.ckpt."""
    folder = tmp_path / "resumed"
    adding(monkeypatch, SigtermAtStep(STOP_AT))
    with pytest.raises(SystemExit):
        run(in_folder(compose_config(*SHORT, *overrides), folder))
    adding(monkeypatch, SaveFinalWeights())
    checkpoint = folder / "checkpoints" / "last.ckpt"
    assert torch.load(checkpoint, weights_only=True)["global_step"] == STOP_AT
    run(in_folder(compose_config(*SHORT, *overrides, f"ckpt_path={checkpoint}"), folder))
    return folder


def straight(compose_config, tmp_path: Path, monkeypatch, *overrides: str) -> Path:
    adding(monkeypatch, SaveFinalWeights())
    run(in_folder(compose_config(*SHORT, *overrides), tmp_path / "straight"))
    return tmp_path / "straight"


IN_MEMORY = {
    "dataloader": [],
    # Lightning gives the loader its state itself when nothing reads the run's length first.
    "no schedule": ["model.scheduler=null"],
    "on device, augmented": ["data.on_device=true", "data/augment=crop"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", IN_MEMORY)
def test_sigterm_mid_epoch_then_resume_equals_a_straight_run(
    compose_config, tmp_path: Path, monkeypatch, case: str
) -> None:
    overrides = IN_MEMORY[case]
    resumed = stopped_and_resumed(compose_config, tmp_path, monkeypatch, *overrides)
    assert_same_run(straight(compose_config, tmp_path, monkeypatch, *overrides), resumed)


@pytest.mark.slow
def test_resume_with_loader_workers_equals_a_straight_run(
    compose_config, tmp_path: Path, monkeypatch
) -> None:
    overrides = ["data.num_workers=2", "data/augment=none"]
    resumed = stopped_and_resumed(compose_config, tmp_path, monkeypatch, *overrides)
    assert_same_run(straight(compose_config, tmp_path, monkeypatch, *overrides), resumed)


def write_image_folder(root: Path, per_class: int = 12) -> Path:
    rng = np.random.default_rng(0)
    for name in ("a", "b", "c"):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / name / f"{i}.png")
    return root


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1])
def test_image_folder_resumes_mid_epoch_with_the_same_augmentation(
    compose_config, tmp_path: Path, monkeypatch, workers: int
) -> None:
    # Random crops and flips, drawn in the workers (or the main process) from their generators.
    folder = write_image_folder(tmp_path / "images")
    overrides = [
        "data=image_folder", f"data.path={folder}", "data.image_size=8", "model=rnn",
        "data.batch_size=4", f"data.num_workers={workers}", "data/augment=flip_crop",
    ]  # fmt: skip
    resumed = stopped_and_resumed(compose_config, tmp_path, monkeypatch, *overrides)
    assert_same_run(straight(compose_config, tmp_path, monkeypatch, *overrides), resumed)


class KilledAtStep(L.Callback):
    """Stops the run at once after step `step`, with nothing saved, as SIGKILL does."""

    def __init__(self, step: int):
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step:
            raise RuntimeError("killed")


@pytest.mark.slow
def test_a_step_checkpoint_resumes_mid_epoch(compose_config, tmp_path: Path, monkeypatch) -> None:
    # last.ckpt every 4 steps as well: killed at step 9, the newest is step 8's, mid-epoch.
    steps = ["callbacks.step_checkpoint.every_n_train_steps=4"]
    folder = tmp_path / "resumed"
    adding(monkeypatch, KilledAtStep(STOP_AT))
    with pytest.raises(RuntimeError, match="killed"):
        run(in_folder(compose_config(*SHORT, *steps), folder))
    checkpoint = folder / "checkpoints" / "last.ckpt"
    saved = torch.load(checkpoint, weights_only=True)
    assert (saved["global_step"], saved["epoch"]) == (8, 1)
    adding(monkeypatch, SaveFinalWeights())
    run(in_folder(compose_config(*SHORT, *steps, f"ckpt_path={checkpoint}"), folder))
    assert_same_run(straight(compose_config, tmp_path, monkeypatch, *steps), folder)


def test_training_order_resumes_its_own_epoch_only() -> None:
    data = list(range(20))
    order = ResumableDistributedSampler(data, num_replicas=1, rank=0, seed=5)
    order.set_epoch(2)
    epoch = list(order)
    served = iter(order)
    head = [next(served) for _ in range(7)]
    state = order.state_dict()

    again = ResumableDistributedSampler(data, num_replicas=1, rank=0, seed=99)
    again.load_state_dict(state)
    again.set_epoch(2)
    assert head + list(again) == epoch  # the rest of the epoch, in order, and its seed
    again.load_state_dict(state)
    again.set_epoch(3)  # a state from an epoch that ended: the next starts whole
    assert sorted(again) == data


def test_device_loader_resumes_its_own_epoch_only() -> None:
    images, labels = torch.arange(40).view(20, 2), torch.arange(20)
    loader = DeviceTensorLoader((images, labels), 4, shuffle=True, seed=1)
    loader.set_epoch(1)
    batches = [labels for _, labels in loader]
    served = iter(loader)
    next(served), next(served)
    state = loader.state_dict()

    again = DeviceTensorLoader((images, labels), 4, shuffle=True, seed=7)
    again.load_state_dict(state)
    again.set_epoch(1)
    rest = [labels for _, labels in again]
    assert len(rest) == 3 and all(map(torch.equal, rest, batches[2:]))
    again.load_state_dict(state)
    again.set_epoch(2)
    assert len(list(again)) == 5


# data.on_device=auto serves a GPU run's batches from tensors on the GPU, a CPU run's from a
# DataLoader; data.on_device=true does the first on the CPU.
ELSEWHERE = [
    pytest.param(["trainer=gpu"], ["trainer=cpu"], id="gpu-then-cpu", marks=ON_GPU),
    pytest.param(["trainer=cpu"], ["trainer=gpu"], id="cpu-then-gpu", marks=ON_GPU),
    pytest.param(["trainer=cpu", "data.on_device=true"], ["trainer=cpu"], id="tensors-then-loader"),
    pytest.param(["trainer=cpu"], ["trainer=cpu", "data.on_device=true"], id="loader-then-tensors"),
]


@pytest.mark.parametrize(("first", "then"), ELSEWHERE)
def test_a_run_resumed_on_another_device_goes_on_learning(
    compose_config, tmp_path: Path, first: list[str], then: list[str]
) -> None:
    common = ["test=false", "trainer.limit_train_batches=8",
              "callbacks.plots=null", *QUIET]  # fmt: skip
    run(compose_config(*first, "trainer.max_epochs=2", *common))
    checkpoint = tmp_path / "run" / "checkpoints" / "last.ckpt"
    run(compose_config(*then, "trainer.max_epochs=4", f"ckpt_path={checkpoint}", *common))
    with open(tmp_path / "run" / "csv" / "metrics.csv") as f:
        val = {int(r["epoch"]): float(r["val/loss"]) for r in csv.DictReader(f) if r["val/loss"]}
    assert sorted(val) == [0, 1, 2, 3]  # the resumed run's epochs follow the checkpoint's
    assert val[3] < val[1]
    assert torch.load(checkpoint, weights_only=True)["global_step"] == 32


def test_a_checkpoint_reads_as_fsdp_reads_it(trained_run) -> None:
    """FSDP's `load_checkpoint` reads a whole checkpoint with Lightning's lazy loader, which knows
    tensors with a typed storage only (a uint32 tensor has none): the saved generator states
    read back through it equal what `torch.load` reads."""
    from lightning.fabric.utilities.load import _lazy_load, _materialize_tensors

    lazy = _materialize_tensors(_lazy_load(trained_run.last_checkpoint))
    full = torch.load(trained_run.last_checkpoint, weights_only=False)
    lazy_rng, full_rng = (c["callbacks"]["ResumeExactly"]["rng"] for c in (lazy, full))
    assert torch.equal(lazy_rng["numpy"][1], full_rng["numpy"][1])
    assert torch.equal(lazy_rng["torch"], full_rng["torch"])
