"""The layers of src/kindling (docs/layout.md): Import Linter's contracts in pyproject.toml hold,
and the picture in the docs lists the layers the contract checks."""

import re
import subprocess
import sys
from pathlib import Path

from helpers import ROOT


def test_every_import_runs_down_the_layers_and_none_goes_round() -> None:
    # Its own process: the command sets up logging anew, which would silence this one's loggers.
    lint_imports = Path(sys.executable).with_name("lint-imports")
    command = [str(lint_imports), "--no-cache", "--config", str(ROOT / "pyproject.toml")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout  # names each import that breaks a contract
    assert re.search(r"Contracts: [1-9]\d* kept, 0 broken", result.stdout), result.stdout


def test_the_docs_picture_the_layers_that_are_checked() -> None:
    from importlinter.api import read_configuration  # a package of the tests' alone

    contracts = read_configuration(str(ROOT / "pyproject.toml"))["contracts_options"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    checked = [[name.strip() for name in layer.split(":")] for layer in layers]
    picture = (ROOT / "docs" / "layout.md").read_text()
    drawn = [row.split(" · ") for row in re.findall(r'^\s+l\d+\[".*<br>(.*)"\]$', picture, re.M)]
    assert drawn == checked
