"""`python train.py` in a subprocess, with a test's own modules importable."""

import os
import subprocess
from pathlib import Path

from conftest import PYTHON, ROOT


def train_py_with(module_dir: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`python train.py <args>` with `module_dir` importable (ranks inherit the environment), so
    a config can name a class the test wrote there: `+callbacks.x._target_=<module>.<Class>`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(module_dir), env.get("PYTHONPATH")]))
    return subprocess.run(
        [*PYTHON, str(ROOT / "train.py"), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
