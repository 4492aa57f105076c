"""A checkpoint that rebuilds its model alone, and a run resumed from it, mid-epoch too, that goes
on as if it had never stopped."""

import random
from typing import Any, Protocol, runtime_checkable

import lightning as L
import numpy as np
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info

from kindling.errors import UserError
from kindling.internals import epoch_end_row  # a private part of Lightning


def rng_states() -> dict[str, Any]:
    """Python, NumPy and torch generator states; "cuda" holds this process's GPU's only."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "python": random.getstate(),
        # int64: a uint32 tensor has no typed storage, which FSDP's lazy loader cannot read.
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
    # The saver's GPU goes to this process's, if any: eight GPUs' checkpoint resumes on one.
    if states["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state(states["cuda"][0])


@runtime_checkable
class KeepsRecord(Protocol):
    """A logger whose record a resumed fit continues (kindling.loggers.resumable_csv)."""

    def save_before_checkpoint(self, to_come: tuple[dict[str, float], int] | None) -> None:
        """Put every row a checkpoint covers on disk before it; `to_come`: the epoch's end row
        Lightning logs after the checkpoint, with its step."""

    def continue_after(self, epoch: int, step: int) -> None:
        """Keep the rows up to a resumed checkpoint's epoch and step, and go on from there."""


class ResumeExactly(Callback):
    """Beyond the weights and loops Lightning saves:

    - each checkpoint holds the run's `config` and `provenance` (kindling.train sets both) as
      plain containers, which `weights_only` loads, and the random generators' states;
    - the training loader gets the checkpoint's position at the start of training (Lightning
      gives it only to a loader made after the checkpoint is loaded, and the schedulers make it
      before); a DataLoader with another worker count gets its sampler's;
    - a logger that keeps a record (`KeepsRecord`) is told where a resumed fit continues, and
      puts the rows a checkpoint covers on disk before it, the epoch's train row too, which
      Lightning logs only after the checkpoint.

    Every run has it (`kindling.train.build_trainer` adds it, whatever the callbacks config).
    """

    def __init__(self, config: dict | None = None, provenance: dict | None = None) -> None:
        self.config, self.provenance = config, provenance
        self._rng: dict[str, Any] | None = None
        self._loader_states: list[dict[str, Any]] = []
        self._data: dict[str, Any] | None = None  # the data's fingerprint, once set up

    def _fingerprint(self, trainer: L.Trainer) -> dict[str, Any] | None:
        if self._data is None:
            from kindling.data.fingerprint import fingerprint

            self._data = fingerprint(trainer.datamodule)
        return self._data

    def state_dict(self) -> dict[str, Any]:
        return {"rng": rng_states()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._rng = state_dict.get("rng")

    def on_fit_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        """The data's fingerprint (set up by now) joins the run's provenance.yaml: two runs are
        told apart by their data too."""
        data = self._fingerprint(trainer)
        if data is None or self.provenance is None or self.config is None:
            return
        self.provenance["data"] = data
        from kindling.run import provenance, run_folder

        provenance.save(self.provenance, run_folder.record_dir(self.config["paths"]["output_dir"]))

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: Any, checkpoint: dict) -> None:
        if self.config is not None:
            checkpoint["config"] = self.config
        checkpoint["provenance"] = {**(self.provenance or {}), "data": self._fingerprint(trainer)}
        loggers = [logger for logger in trainer.loggers if isinstance(logger, KeepsRecord)]
        if loggers:
            to_come = epoch_end_row(trainer)  # on every rank: its values may be reduced
            for logger in loggers:
                logger.save_before_checkpoint(to_come)

    def on_load_checkpoint(self, trainer: L.Trainer, pl_module: Any, checkpoint: dict) -> None:
        # Taken out, so Lightning never gives a loader a state it cannot take.
        fit_loop = checkpoint.get("loops", {}).get("fit_loop", {})
        self._loader_states = fit_loop.get("state_dict", {}).pop("combined_loader", [])
        if trainer.state.fn == TrainerFn.FITTING:  # not a test of the best checkpoint
            self._check_same_data(trainer, checkpoint.get("provenance", {}).get("data"))
            for logger in trainer.loggers:
                if isinstance(logger, KeepsRecord):
                    logger.continue_after(checkpoint["epoch"], checkpoint["global_step"])

    def _check_same_data(self, trainer: L.Trainer, stored: dict[str, Any] | None) -> None:
        """Resumed on other data, the splits would be carved afresh: a test sample could be
        trained on, and the sampler's position would fall elsewhere."""
        current = self._fingerprint(trainer)
        if not stored or not current:  # an older checkpoint, or data of another kind
            return
        from kindling.data.fingerprint import changes

        if said := changes(stored, current):
            raise UserError(
                f"{trainer.ckpt_path} was trained on other data: {'; '.join(said)}. Resuming "
                "would carve the splits afresh (samples of one could be another's, test samples "
                "trained on). Train a new run on this data, from its weights if you like "
                f"(weights_from={trainer.ckpt_path} instead of ckpt_path=), or resume with the "
                "data it was trained on."
            )

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._loader_states:
            from kindling.data.resumed_loader import continue_training_loader

            if not continue_training_loader(trainer, self._loader_states):
                rank_zero_info(
                    "The checkpoint's training batches were served another way (from tensors on "
                    "the device, or by a DataLoader; data.on_device=auto decides by the device): "
                    "the rest of an interrupted epoch comes from a new pass over the data."
                )
            self._loader_states = []
        if self._rng is not None:
            set_rng_states(self._rng)
            self._rng = None
