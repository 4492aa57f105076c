"""The configs' JSON schemas (`python -m kindling.schemas`): every config validates against the
schema its code gives, the committed editor settings map every config to its schema, and a
forker's new config gets one that names a misspelt key and a wrong type."""

import json
import shutil
import textwrap

import jsonschema
import pytest
from hydra import initialize_config_dir
from omegaconf import OmegaConf

from kindling import schemas

from helpers import ROOT, made_once

FORKERS_NET = '''
from typing import Literal

from torch import nn


class ForkersNet(nn.Sequential):
    """A forker's own net."""

    def __init__(
        self, num_classes: int, width: int = 64, activation: Literal["relu", "gelu"] = "relu"
    ):
        """Args:
            num_classes: the size of the output.
            width: the hidden layer's size.
        """
        super().__init__(nn.LazyLinear(width), nn.ReLU(), nn.Linear(width, num_classes))
'''
# configs/model/mine.yaml: a misspelt key (widht), a choice the Literal lacks, a word for a number.
MINE = """
defaults:
  - _base/classifier@_here_
  - _self_

net:
  _target_: kindling_test_forkers_net.ForkersNet
  num_classes: ${data.num_classes}
  widht: 32
  activation: tanh
optimizer:
  lr: fast
"""


@pytest.fixture(scope="session")
def generated(tmp_path_factory):
    """The one command run in a copy of the repository whose configs add `model/mine.yaml`,
    a model config naming the forker's own class: once for the session (it takes tens of
    seconds), whichever worker asks first."""

    def write(root):
        shutil.copytree(ROOT / "configs", root / "configs", ignore=shutil.ignore_patterns("local"))
        (root / "configs/model/mine.yaml").write_text(MINE)
        (root / "kindling_test_forkers_net.py").write_text(textwrap.dedent(FORKERS_NET))
        with pytest.MonkeyPatch.context() as patch:
            patch.syspath_prepend(str(root))
            schemas.write(root)

    root, _ = made_once(tmp_path_factory, "schemas_generated", write)
    return root


def _schemas(root):
    return {
        p.relative_to(root / ".schemas").as_posix(): p.read_text()
        for p in (root / ".schemas").rglob("*.json")
    }


def _errors(schema, yaml_file):
    raw = OmegaConf.to_container(OmegaConf.load(yaml_file))
    return [
        f"{e.json_path}: {e.message}" for e in jsonschema.Draft7Validator(schema).iter_errors(raw)
    ]


def _schema_of(name):
    """The schema of one config, generated from the code (the whole set takes seconds)."""
    with initialize_config_dir(str(ROOT / "configs"), version_base=None):
        return schemas._file_schema(ROOT / "configs" / f"{name}.yaml", name)[name]


def test_a_misspelt_key_and_a_wrong_type_are_named(tmp_path):
    config = tmp_path / "lstm.yaml"
    config.write_text("net:\n  hiden_size: 64\noptimizer:\n  lr: fast\n")
    errors = sorted(_errors(_schema_of("model/lstm"), config))
    assert len(errors) == 2 and "'hiden_size' was unexpected" in errors[0], errors
    assert errors[0].startswith("$.net: ") and errors[1].startswith("$.optimizer.lr: "), errors


def test_interpolations_and_missing_values_stand_for_any_value(tmp_path):
    schema = _schema_of("trainer/default")
    config = tmp_path / "trainer.yaml"
    config.write_text("max_epochs: ${oc.env:EPOCHS}\ndevices: ???\nprecision: bf16-mixed\n")
    assert _errors(schema, config) == []
    config.write_text("max_epochs: ten\nprecision: 17\naccelerater: gpu\n")
    errors = _errors(schema, config)
    assert sorted(e.split(":")[0] for e in errors) == ["$", "$.max_epochs", "$.precision"], errors
    assert any("'accelerater' was unexpected" in e for e in errors), errors


@pytest.mark.slow
def test_every_config_validates_and_the_editor_settings_name_every_schema(generated):
    fresh = {
        n: json.loads(text) for n, text in _schemas(generated).items() if n != "model/mine.json"
    }
    assert len(fresh) > 50 and "model/cnn.json" in fresh and "experiment/example.json" in fresh
    for name, schema in fresh.items():
        assert _errors(schema, ROOT / "configs" / name.replace(".json", ".yaml")) == [], name
    settings = json.loads((generated / ".vscode/settings.json").read_text())["yaml.schemas"]
    del settings[".schemas/model/mine.json"]
    committed = json.loads((ROOT / ".vscode/settings.json").read_text())["yaml.schemas"]
    assert committed == settings, "run `python -m kindling.schemas` and commit .vscode/"


@pytest.mark.slow
def test_a_new_config_is_checked_by_its_class(generated):
    """What the forker's editor shows in model/mine.yaml: each mistake at its key, the net's
    arguments with their defaults and descriptions, and the one the config must give."""
    schema = json.loads((generated / ".schemas/model/mine.json").read_text())
    assert (
        "configs/model/mine.yaml"
        in json.loads((generated / ".vscode/settings.json").read_text())["yaml.schemas"].values()
    )
    errors = _errors(schema, generated / "configs/model/mine.yaml")
    assert any(e.startswith("$.net: ") and "'widht' was unexpected" in e for e in errors), errors
    assert any(e.startswith("$.net.activation: ") for e in errors), errors
    assert any(e.startswith("$.optimizer.lr: ") for e in errors), errors
    assert len(errors) == 3, errors
    net = schema["properties"]["net"]
    assert net["required"] == ["num_classes"]
    assert net["properties"]["width"]["default"] == 64
    assert net["properties"]["width"]["description"] == "the hidden layer's size."
    assert net["properties"]["activation"]["anyOf"][0] == {"enum": ["relu", "gelu"]}
    assert schema["description"].startswith("kindling.modules.classifier.Classifier: ")
