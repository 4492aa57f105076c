"""Less time in Python's cyclic garbage collector for the processes kindling's entrypoints start.

Importing torch, Lightning and Hydra creates about half a million objects that live as long as
the process, which every full collection traverses again: seconds of a short run
(`benchmarks/collector.py`). `gc.freeze` exempts them and costs nothing else (they are still
freed by reference counts). A process that runs kindling in-process (pytest) keeps the defaults.
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
    """Exit without the collector's passes over every live object; atexit handlers, flushing
    and reference counting still run. Registered first, the freeze runs after the others."""
    atexit.register(gc.freeze)
