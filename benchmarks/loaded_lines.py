"""How much of kindling a default run loads: the lines of every kindling file in `sys.modules`
when `python train.py` exits, `train.py` included.

    python benchmarks/loaded_lines.py [overrides...]     # e.g. trainer.max_epochs=1

Runs `train.py` in this process (as `python train.py <overrides>` would, in a temporary
folder) and prints the total, then each file with its lines, largest first.
"""

import os
import runpy
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "kindling"


def report() -> None:
    files = {
        Path(module.__file__).resolve()
        for module in list(sys.modules.values())
        if getattr(module, "__file__", None)
    }
    # train.py itself: runpy takes its module out of sys.modules once it has run.
    ours = [f for f in files if f.is_relative_to(PACKAGE)] + [ROOT / "train.py"]
    lines = {f: len(f.read_text().splitlines()) for f in ours}
    out = sys.__stdout__
    print(f"kindling source loaded: {sum(lines.values())} lines in {len(lines)} files", file=out)
    for file, count in sorted(lines.items(), key=lambda item: -item[1]):
        print(f"  {count:5d}  {file.relative_to(ROOT)}", file=out)


if __name__ == "__main__":
    os.chdir(tempfile.mkdtemp(prefix="kindling-loaded-lines-"))  # the run folder goes here
    sys.argv = [str(ROOT / "train.py"), *sys.argv[1:]]
    try:
        runpy.run_path(str(ROOT / "train.py"), run_name="__main__")
    finally:  # before the exit handlers: train.py's last one ends the process (os._exit)
        report()
