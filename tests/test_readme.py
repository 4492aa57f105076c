"""README.md's `python train.py` commands run as written, on a CPU without network: each with
`debug=limit`, one epoch and one batch of each split added, so that it trains a step. Left out:
those that need a GPU or download a data set (`trainer=gpu`, `data=mnist`, `cifar10`,
`fashion_mnist`)."""

import re
import shlex
from pathlib import Path

import pytest

from helpers import ROOT, train_py, train_py_here

NEEDS_MORE = re.compile(r"trainer=gpu|data=(mnist|cifar10|fashion_mnist)\b")
# Every stage still runs (sanity check, fit, validation, test), on a single batch.
ONE_BATCH = [
    "trainer.max_epochs=1", "trainer.limit_train_batches=1", "trainer.limit_val_batches=1",
    "trainer.limit_test_batches=1", "callbacks.rich_progress_bar=null",
]  # fmt: skip


def readme_commands() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    lines = [line.split("  #")[0].strip() for block in blocks for line in block.splitlines()]
    return [line for line in lines if line.startswith("python train.py")]


COMMANDS = [c for c in readme_commands() if not NEEDS_MORE.search(c)]


def test_the_readme_shows_commands_to_run() -> None:
    assert len(COMMANDS) >= 5, COMMANDS


@pytest.mark.slow
@pytest.mark.parametrize("command", COMMANDS)
def test_a_readme_command_runs_as_written(command: str, tmp_path: Path) -> None:
    python, script, *args = shlex.split(command)
    assert (python, script) == ("python", "train.py")
    if "--help" not in args:
        short = [] if any(a.startswith("debug=") for a in args) else ["debug=limit"]
        args += [*short, *ONE_BATCH]
    # In this process, as train.py's __main__, but where the command starts processes of its own.
    several = any(a.startswith(("trainer.devices=", "trainer=ddp")) for a in args)
    result = (train_py if several else train_py_here)(*args, cwd=tmp_path)
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]


def test_the_manuals_home_page_links_every_page() -> None:
    pages = {p.name for p in (ROOT / "docs").glob("*.md")} - {"index.md"}
    linked = set(re.findall(r"\]\(([\w.]+\.md)\)", (ROOT / "docs" / "index.md").read_text()))
    assert pages <= linked, sorted(pages - linked)
