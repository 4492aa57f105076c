"""What a resumed run needs beyond weights and loop state: the random number generators."""

import random
from typing import Any

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback


def rng_states() -> dict[str, Any]:
    """Python, NumPy and torch (CPU and CUDA) generator states, as plain containers and tensors."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": [kind, torch.from_numpy(keys.copy()), pos, has_gauss, cached],
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def set_rng_states(states: dict[str, Any]) -> None:
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    kind, keys, pos, has_gauss, cached = states["numpy"]
    np.random.set_state((kind, keys.numpy(), pos, has_gauss, cached))
    torch.set_rng_state(states["torch"])
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


class RestoreRandomState(Callback):
    """Save the generators with each checkpoint and restore them when training resumes.

    Lightning restores weights, optimizer and loop state, but not the generators that shuffle
    the data and draw dropout masks; with them, 2 epochs + resume equals 4 epochs straight.
    The sanity-check validation before training draws from them too (each DataLoader iterator
    takes a seed), so it is made to leave them as it found them.
    """

    def __init__(self) -> None:
        self._before_sanity_check: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        return {"rng": rng_states()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if "rng" in state_dict:
            set_rng_states(state_dict["rng"])

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._before_sanity_check = rng_states()

    def on_sanity_check_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._before_sanity_check is not None:
            set_rng_states(self._before_sanity_check)
            self._before_sanity_check = None
