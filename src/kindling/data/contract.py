"""What kindling asks of a data module (docs/your_project.md, *A data set*), checked when the run
builds it, before any data is read or any step trained.

Required: a `LightningDataModule` with `train_dataloader` and `val_dataloader` where the run
trains (`train=true`: the checkpoints and early stopping watch `val/*`), and `test_dataloader`
where it tests (`test=true`).

Optional, each used by its feature where the module has it (kindling's `SplitDataModule` has them
all, and so every module built on it):
- `describe()` (`DescribesItself`): the `data.` keys the config leaves null, filled in before
  the model is built (a folder's classes, a table's features).
- `fixed_batch_shapes` (`HasBatchShapes`): False where batches vary in shape, so that
  `trainer.benchmark` (cuDNN's algorithm search) stays off.
- `state_dict()` / `load_state_dict()`: what a checkpoint keeps of the data (the training
  statistics, the classes), for resuming and for `python -m kindling.predict` and `export`.
- `predict_input`, `inputs_to_predict(path)`, `predict_names`: `python -m kindling.predict`.
- `training_sampler(...)`: the order of the training samples, saved for an exact resume mid-epoch.
"""

from typing import Any, Protocol, runtime_checkable

import lightning as L
from lightning.pytorch.utilities.model_helpers import is_overridden

from kindling.errors import UserError


@runtime_checkable
class DescribesItself(Protocol):
    def describe(self) -> dict[str, Any]: ...


@runtime_checkable
class HasBatchShapes(Protocol):
    fixed_batch_shapes: bool


def check_data_module(datamodule: object, *, train: bool, test: bool) -> None:
    """Refuse, in one line, a data module that cannot serve what the run asks of it."""
    name = type(datamodule).__name__
    if not isinstance(datamodule, L.LightningDataModule):
        raise UserError(
            f"data._target_ builds a {name}, not a LightningDataModule: point it at a data "
            "module (docs/your_project.md, A data set)."
        )
    needed = {"train_dataloader": train, "val_dataloader": train, "test_dataloader": test}
    missing = [hook for hook, use in needed.items() if use and not is_overridden(hook, datamodule)]
    if missing:
        switch = "test=false" if missing == ["test_dataloader"] else "train=false"
        raise UserError(
            f"{name} has no {' or '.join(f'{m}()' for m in missing)}, which this run needs: "
            f"define it, or run with {switch}."
        )
