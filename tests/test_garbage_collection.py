"""Entrypoints exempt the objects of their imports from Python's cyclic collector, and exit
without collecting (kindling/garbage_collection.py)."""

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import QUIET, ROOT, importable


def python(code: str, *args: str, **kwargs) -> subprocess.CompletedProcess:
    # A fresh interpreter (`-c` never starts warm): what a collector setting does to a process.
    result = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, **kwargs
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result


def test_imports_are_frozen_and_collection_comes_back_on() -> None:
    result = python(
        "import gc\n"
        "from kindling.garbage_collection import long_lived_imports\n"
        "with long_lived_imports():\n"
        "    during = gc.isenabled()\n"
        "    import decimal, json\n"
        "print(during, gc.isenabled(), gc.get_freeze_count())\n"
    )
    during, after, frozen = result.stdout.split()
    assert (during, after) == ("False", "True")
    assert int(frozen) > 1000


def test_exit_freezes_after_every_other_atexit_handler() -> None:
    # Registered before the freeze, so it runs after it, as shutdown's collections would.
    result = python(
        "import atexit, gc\n"
        "atexit.register(lambda: print(gc.get_freeze_count()))\n"
        "from kindling.garbage_collection import skip_collections_at_exit\n"
        "skip_collections_at_exit()\n"
        "atexit.register(lambda: print(gc.get_freeze_count()))\n"
    )
    last_handler, after_freeze = map(int, result.stdout.split())
    assert last_handler == 0
    assert after_freeze > 1000


PROBE = """
import gc
from lightning.pytorch.callbacks import Callback

class Probe(Callback):
    def on_fit_start(self, trainer, pl_module):
        print("at fit start", gc.isenabled(), gc.get_freeze_count())
"""


@pytest.mark.slow
def test_train_py_freezes_its_imports_and_exits_without_collecting(tmp_path: Path) -> None:
    (tmp_path / "gc_probe.py").write_text(PROBE)
    run_train_py = (
        "import atexit, gc, runpy, sys\n"
        "atexit.register(lambda: print('at exit', gc.get_freeze_count()))\n"
        "sys.argv = sys.argv[1:]\n"
        "runpy.run_path(sys.argv[0], run_name='__main__')\n"
    )
    overrides = ["debug=fdr", "+callbacks.gc_probe._target_=gc_probe.Probe", *QUIET]
    env = importable(tmp_path)
    result = python(run_train_py, str(ROOT / "train.py"), *overrides, cwd=tmp_path, env=env)
    lines = result.stdout.splitlines()
    (at_start,) = [line.split()[3:] for line in lines if line.startswith("at fit start")]
    (at_exit,) = [int(line.split()[2]) for line in lines if line.startswith("at exit")]
    enabled, frozen_at_start = at_start[0], int(at_start[1])
    # torch, Lightning and Hydra: hundreds of thousands of objects, none traversed again.
    assert frozen_at_start > 100_000
    assert enabled == "True"
    # What the run made was frozen at exit too.
    assert at_exit > frozen_at_start
