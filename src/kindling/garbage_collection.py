"""Less time in Python's cyclic garbage collector for the processes that kindling starts.

Importing torch, Lightning, torchmetrics and Hydra creates about half a million objects that
live as long as the process, and nearly none of them is garbage. Python's collector still
traverses all of them in every full collection, during the imports, during the run and at
interpreter shutdown: seconds of a short run (`benchmarks/collector.py`, BENCHMARKS.md).
Exempting these objects from collection (`gc.freeze`) costs nothing else: they are still freed
when nothing refers to them.

Only entrypoints (`train.py`, `python -m kindling.predict`, ...) use this; a process that runs
kindling in-process (a notebook, pytest) keeps Python's defaults.
"""

import atexit
import gc
from collections.abc import Iterator
from contextlib import contextmanager


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


def skip_collections_at_exit() -> None:
    """Let the interpreter exit without traversing every object of the process again.

    Shutdown still runs every atexit handler, flushes and closes what is open, and frees what is
    freed by reference counts; only the cyclic collector's passes over live objects are skipped
    (Python never promised `__del__` of objects alive at exit to run). Registered first, the
    freeze runs after every other atexit handler.
    """
    atexit.register(gc.freeze)
