"""A callback for tests that start `train.py` in subprocesses: which training samples each rank
saw, as digests of the images, in `<run folder>/samples_rank<N>.json`."""

import hashlib
import json
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
