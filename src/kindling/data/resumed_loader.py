"""The training loader of a fit resumed from a checkpoint: its place in the epoch, which
Lightning gives only to a loader made after the checkpoint is loaded (Lightning-AI/
pytorch-lightning#20550; the schedulers make it before). Imported where a checkpoint holds one."""

from typing import Any

import lightning
from lightning.fabric.utilities import data as fabric_data
from lightning.fabric.utilities.types import _Stateful
from lightning.pytorch.utilities.combined_loader import CombinedLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from kindling.data.device_loader import DeviceTensorLoader
from kindling.internals import check_sampler_epoch, require


def continue_training_loader(trainer: lightning.Trainer, states: list[dict]) -> bool:
    """Give the training loaders of a resumed fit their epoch, the checkpoint's `states` (as
    each loader takes them: False, nothing done, where another kind of loader saved them) and a
    new iterator (private parts of Lightning)."""
    check_sampler_epoch()
    for name in ("_combined_loader", "_data_fetcher"):
        require(hasattr(trainer.fit_loop, name), f"_FitLoop.{name}")
    load = getattr(CombinedLoader, "_load_state_dicts", None)
    require(callable(load), "CombinedLoader._load_state_dicts(states)")
    loop = trainer.fit_loop
    combined, fetcher = loop._combined_loader, loop._data_fetcher
    if combined is None or fetcher is None:
        return True
    stateful = [loader for loader in combined.flattened if isinstance(loader, _Stateful)]
    adapted = list(map(_as_loader_takes, stateful, states))
    if None in adapted:
        return False
    for loader in combined.flattened:
        fabric_data._set_sampler_epoch(loader, loop.epoch_progress.current.processed)
    combined._load_state_dicts(adapted)
    iter(fetcher)
    return True


def _as_loader_takes(loader: object, state: dict[str, Any]) -> dict[str, Any] | None:
    """`state` as `loader` takes it; None if the other kind of loader saved it."""
    if isinstance(loader, DeviceTensorLoader) != ({"seed", "epoch"} <= state.keys()):
        return None
    # torchdata's private layout, read because it refuses a state of another worker count and has
    # no public way to load the sampler's part (meta-pytorch/data#1260); a changed layout reads
    # as no sampler state, and the state then goes in whole.
    main = state["_snapshot"]["_main_snapshot"] if "_snapshot" in state else state
    sampler_state = (main.get("_sampler_iter_state") or {}).get("sampler_state")
    sampler = getattr(loader, "sampler", None)
    if (
        isinstance(loader, StatefulDataLoader)
        and main.get("_num_workers", 0) != loader.num_workers
        and sampler_state is not None
        and hasattr(sampler, "load_state_dict")
    ):
        sampler.load_state_dict(sampler_state)  # the workers' random draws start afresh
        return {}  # StatefulDataLoader.load_state_dict({}) changes nothing
    return state
