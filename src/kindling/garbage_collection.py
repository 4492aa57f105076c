"""Less time in Python's garbage collector: importing torch, Lightning and Hydra creates about
half a million objects that live as long as the process, which every full collection traverses
again (seconds of a short run: `benchmarks/collector.py`); `gc.freeze` exempts them."""

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
    """Exit without the collector's passes over every live object (registered first, the freeze
    runs after the other atexit handlers)."""
    atexit.register(gc.freeze)
