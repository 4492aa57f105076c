"""What a resumed run needs beyond weights and loop state: the random number generators, and the
training loader where the checkpoint left it."""

import random
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities import rank_zero_info


def rng_states() -> dict[str, Any]:
    """Python, NumPy and torch (CPU and CUDA) generator states, as plain containers and tensors.

    "cuda" holds the generator of this process's GPU (Lightning makes it the current device),
    none without one: a DDP rank draws from its own GPU only, and the other GPUs it can see
    are other ranks'.
    """
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    # The uint32 keys are kept as int64: a uint32 tensor has no typed storage, which Lightning's
    # lazy checkpoint loader (FSDP's load_checkpoint) cannot read.
    return {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
        "cuda": [torch.cuda.get_rng_state()] if torch.cuda.is_available() else [],
    }


def set_rng_states(states: dict[str, Any]) -> None:
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    # The saving process's GPU goes to this process's, if it has one: a checkpoint of eight GPUs
    # resumes on one, or on a CPU. (Older checkpoints hold every GPU the saver could see; the
    # first is its own when it ran on cuda:0.)
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"][0])


class ResumeExactly(Callback):
    """A run resumed from a checkpoint goes on as if it had never stopped, mid-epoch too.

    Lightning restores weights, optimizer and loop state, and saves the state of a training
    loader that has one (torchdata's `StatefulDataLoader`, `DeviceTensorLoader`); this adds the
    generators that draw dropout masks, saved with each checkpoint, and makes sure the loader's
    state is the one training continues from. Lightning gives it to the loader only when it
    makes the loader after loading the checkpoint, and kindling's schedulers make it before
    (they read `trainer.estimated_stepping_batches`, Lightning issue 20550); and its iterator is
    made before the epoch is set. So at the start of training the loader gets the epoch, then
    the checkpoint's state, then a new iterator; then the generators get theirs, last, so
    nothing a resumed run does before its first step draws from them. A DataLoader with another
    number of workers than the checkpoint's (torchdata refuses its state) gets only its
    sampler's, the epoch's position.
    """

    def __init__(self) -> None:
        self._rng: dict[str, Any] | None = None
        self._loader_states: list[dict[str, Any]] = []

    def state_dict(self) -> dict[str, Any]:
        return {"rng": rng_states()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._rng = state_dict.get("rng")

    def on_load_checkpoint(
        self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]
    ) -> None:
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
        # Taken out, so that Lightning never gives a loader a state it cannot take; given in
        # on_train_start, once the loaders are known.
        self._loader_states = fit_loop.get("state_dict", {}).pop("combined_loader", [])

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._loader_states:
            from kindling.internals import continue_training_loader  # a private part of Lightning

            if not continue_training_loader(trainer, self._loader_states, _as_loader_takes):
                rank_zero_info(
                    "The checkpoint's training batches were served another way (from tensors on "
                    "the device, or by a DataLoader; data.on_device=auto decides by the device): "
                    "the rest of an interrupted epoch comes from a new pass over the data."
                )
            self._loader_states = []
        if self._rng is not None:
            set_rng_states(self._rng)
            self._rng = None


def _as_loader_takes(loader: object, state: dict[str, Any]) -> dict[str, Any] | None:
    """`state` as `loader` takes it; None if a loader of the other kind saved it: a
    `DeviceTensorLoader`'s for a `DeviceTensorLoader` (a GPU run's with data.on_device=auto), a
    DataLoader's for another."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    from kindling.data.device_loader import DeviceTensorLoader

    if isinstance(loader, DeviceTensorLoader) != ({"seed", "epoch"} <= state.keys()):
        return None
    sampler = getattr(loader, "sampler", None)
    if (
        isinstance(loader, StatefulDataLoader)
        and _loader_workers(state) != loader.num_workers
        and _sampler_state(state) is not None
        and hasattr(sampler, "load_state_dict")
    ):
        # torchdata refuses a state of another number of workers, which data.num_workers=null
        # gives on another number of processes per machine: the sampler alone goes on from the
        # checkpoint's place (the workers' random draws, augmentation's, start afresh).
        sampler.load_state_dict(_sampler_state(state))
        return {}  # nothing more: StatefulDataLoader.load_state_dict({}) changes nothing
    return state


# Where torchdata's StatefulDataLoader keeps what kindling reads of its state: with workers, in
# the snapshot of its main process (taken every step, torchdata's default). A private layout,
# read because torchdata asserts the worker count of a state it loads and offers no public way
# to take the sampler's part alone (its `_reset_state_vars`, meta-pytorch/data#1260); a changed
# layout reads as no sampler state, and the loader's state then goes in whole, as before.
def _main_state(state: dict[str, Any]) -> dict[str, Any]:
    return state["_snapshot"]["_main_snapshot"] if "_snapshot" in state else state


def _loader_workers(state: dict[str, Any]) -> int:
    return _main_state(state).get("_num_workers", 0)


def _sampler_state(state: dict[str, Any]) -> dict[str, Any] | None:
    return (_main_state(state).get("_sampler_iter_state") or {}).get("sampler_state")
