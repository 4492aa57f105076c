"""Less time in Python's garbage collector: importing torch, Lightning and Hydra creates about
half a million objects that live as long as the process, which every full collection traverses
again (seconds of a short run: `benchmarks/collector.py`); `gc.freeze` exempts them."""

import atexit
import gc
import importlib
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType


@contextmanager
def long_lived_imports() -> Iterator[None]:
    """Import without collecting, then exempt everything imported from later collections."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def import_long_lived(name: str) -> ModuleType:
    """Import module `name` inside `long_lived_imports`, the first time it is asked for."""
    if name in sys.modules:  # a multirun's later jobs: nothing new to exempt
        return sys.modules[name]
    with long_lived_imports():
        return importlib.import_module(name)


def skip_collections_at_exit() -> None:
    """Exit without the collector's passes over every live object (registered first, the freeze
    runs after the other atexit handlers)."""
    atexit.register(gc.freeze)
