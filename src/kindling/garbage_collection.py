"""Less time in Python's garbage collector: importing torch, Lightning and Hydra creates about
half a million objects that live as long as the process, which every full collection traverses
again (seconds of a short run: `benchmarks/collector.py`); `gc.freeze` exempts them, and a run
that ends ends without the interpreter's teardown, which would traverse and free them all."""

import atexit
import gc
import importlib
import logging
import os
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


@contextmanager
def ending_without_teardown() -> Iterator[None]:
    """Run the body; once every atexit handler has run, end the process with the body's exit
    status (0, or a `sys.exit(<int>)`'s) and skip the interpreter's teardown: a second or more of
    freeing the imports' objects one by one. An exception, or a `sys.exit(<message>)`, ends the
    usual way, the frozen objects given back to the collector first: frozen, they would outlive
    the teardown of extensions that report what outlives them as leaked (Triton's, which torch
    imports, prints hundreds of lines). Enter it first thing in `__main__`: handlers registered
    before it do not run, except logging's, called here; one registered as the interpreter starts
    (coverage's, measuring a subprocess) needs its own hook on `os._exit` (coverage: `patch =
    _exit`)."""
    status: list[int] = []

    def end() -> None:
        if not status:
            gc.unfreeze()
            return
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status[0])

    atexit.register(end)  # registered first, it runs last
    try:
        yield
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            status.append(stop.code or 0)
        raise
    status.append(0)
