"""The layers of src/kindling (docs/layout.md): Import Linter's contracts in pyproject.toml hold,
and the picture in the docs lists the layers the contract checks."""

import re

import pytest
from importlinter.api import read_configuration
from importlinter.cli import lint_imports

from helpers import ROOT


def test_every_import_runs_down_the_layers_and_none_goes_round(
    capsys: pytest.CaptureFixture,
) -> None:
    status = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True)
    output = capsys.readouterr().out
    assert status == 0, output  # names each import that breaks a contract
    assert re.search(r"Contracts: [1-9]\d* kept, 0 broken", output), output


def test_the_docs_picture_the_layers_that_are_checked() -> None:
    contracts = read_configuration(str(ROOT / "pyproject.toml"))["contracts_options"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    checked = [[name.strip() for name in layer.split(":")] for layer in layers]
    picture = (ROOT / "docs" / "layout.md").read_text()
    drawn = [row.split(" · ") for row in re.findall(r'^\s+l\d+\[".*<br>(.*)"\]$', picture, re.M)]
    assert drawn == checked
