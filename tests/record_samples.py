"""Callbacks for tests that start `train.py` in subprocesses: which training samples each rank
saw, as digests of the images, in `<run folder>/samples_rank<N>.json`; and the like."""

import hashlib
import json
import os
import signal
from pathlib import Path

import lightning as L
from lightning.pytorch.callbacks import Callback


class RecordSamples(Callback):
    def __init__(self) -> None:
        self.digests: list[str] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        images = batch[0].float().cpu()
        self.digests += [hashlib.sha1(image.numpy().tobytes()).hexdigest() for image in images]

    def on_train_end(self, trainer: L.Trainer, pl_module) -> None:
        path = Path(trainer.default_root_dir) / f"samples_rank{trainer.global_rank}.json"
        path.write_text(json.dumps(self.digests))


class RecordEpochSamples(Callback):
    """The digests of each epoch's training samples, `{epoch: [digest, ...]}`, in
    `<run folder>/<name>_rank<N>.json`, written after every step: a run stopped by a signal
    keeps the record of what it trained on."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.epochs: dict[int, list[str]] = {}

    def on_train_batch_start(self, trainer: L.Trainer, pl_module, batch, batch_idx: int) -> None:
        images = batch[0].float().cpu()
        digests = [hashlib.sha1(image.numpy().tobytes()).hexdigest() for image in images]
        self.epochs.setdefault(trainer.current_epoch, []).extend(digests)

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        path = Path(trainer.default_root_dir) / f"{self.name}_rank{trainer.global_rank}.json"
        path.write_text(json.dumps(self.epochs))


class SigtermAtStep(Callback):
    """Rank 0 sends itself SIGTERM after optimizer step `step`, as a cluster pre-empting the run
    does (kindling stops every rank at a step's end and writes last.ckpt)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: L.Trainer, *args) -> None:
        if trainer.global_step == self.step and trainer.global_rank == 0:
            os.kill(os.getpid(), signal.SIGTERM)


class CountGenerateCalls(Callback):
    """How often each rank ran the module's `generate`, in `<run folder>/generate_rank<N>.json`."""

    def __init__(self) -> None:
        self.calls = 0

    def setup(self, trainer: L.Trainer, pl_module, stage: str) -> None:
        generate = pl_module.generate

        def counted(*args, **kwargs):
            self.calls += 1
            return generate(*args, **kwargs)

        pl_module.generate = counted

    def on_fit_end(self, trainer: L.Trainer, pl_module) -> None:
        path = Path(trainer.default_root_dir) / f"generate_rank{trainer.global_rank}.json"
        path.write_text(json.dumps(self.calls))
