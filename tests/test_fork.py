"""A project started from kindling with copier, given a model and a data set of its own the way
docs/your_project.md says (a net and a copy of configs/model/cnn.yaml; a data module on
InMemoryImageDataModule and its config): its tests take both in by discovery and pass, and the
new model learns the new data."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from forked import run_forked
from helpers import QUIET, copy_tracked_files, git

MLP = '''"""A multilayer perceptron over the flattened image."""

import math
from collections.abc import Sequence

import torch
from torch import nn


class MLP(nn.Module):
    def __init__(self, image_shape: Sequence[int], num_classes: int, hidden: int = 64):
        super().__init__()
        self.layers = nn.Sequential(
            nn.Flatten(), nn.Linear(math.prod(image_shape), hidden), nn.ReLU(),
            nn.Linear(hidden, num_classes),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.layers(images)
'''

# Grey 8x8 images with one bright row: the row is the class.
STRIPES = '''"""Grey 8x8 images of one bright row each: the row is the class."""

import torch

from myproj.data.in_memory import InMemoryImageDataModule, Split


class StripesDataModule(InMemoryImageDataModule):
    def load_splits(self) -> tuple[Split, Split]:
        generator = torch.Generator().manual_seed(0)
        labels = torch.randint(0, 4, (600,), generator=generator)
        images = torch.rand(600, 1, 8, 8, generator=generator) * 0.5
        images[torch.arange(600), 0, labels * 2] += 0.5
        return (images[:500], labels[:500]), (images[500:], labels[500:])
'''

STRIPES_CONFIG = """# Grey 8x8 images of one bright row each.
defaults:
  - _base/in_memory_image@_here_
  - _self_

_target_: myproj.data.stripes.StripesDataModule
num_classes: 4
image_shape: [1, 8, 8]
"""


def run(command: list[str], cwd: Path, **env: str) -> str:
    result = subprocess.run(
        command, cwd=cwd, capture_output=True, text=True, env={**os.environ, **env}, timeout=600
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    return result.stdout


@pytest.mark.slow
def test_a_copier_fork_takes_in_a_model_and_data_of_its_own_and_its_tests_pass(tmp_path) -> None:
    template = copy_tracked_files(tmp_path / "kindling")
    git(template, "init", "-q", "-b", "main")
    git(template, "add", ".")
    git(template, "commit", "-q", "-m", "kindling")
    project = tmp_path / "myproj"
    copier = [sys.executable, "-m", "copier", "copy", "--trust", "--defaults"]
    run([*copier, "--data=package_name=myproj", str(template), str(project)], tmp_path)
    git(project, "init", "-q", "-b", "main")  # as the docs say
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "Start from kindling")

    # The model: a net in models/, and a copy of cnn.yaml pointing at it, one key per argument.
    (project / "src" / "myproj" / "models" / "mlp.py").write_text(MLP)
    cnn = (project / "configs" / "model" / "cnn.yaml").read_text()
    mlp = cnn.replace("myproj.models.cnn.CNNClassifier", "myproj.models.mlp.MLP")
    mlp = re.sub(r"  channels: .*\n  dropout: .*\n", "  hidden: 64\n", mlp)
    (project / "configs" / "model" / "mlp.yaml").write_text(mlp)
    # The data: a data module on InMemoryImageDataModule and its config.
    (project / "src" / "myproj" / "data" / "stripes.py").write_text(STRIPES)
    (project / "configs" / "data" / "stripes.yaml").write_text(STRIPES_CONFIG)

    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "A model and a data set of my own")

    # The project's package on the path: its dependencies are this environment's (installing
    # them again would prove nothing more). The editor's schemas (`python -m myproj.schemas`)
    # serve the slow schema tests alone, which are not run here.
    src = {"PYTHONPATH": str(project / "src")}

    # Every fast test of the fork that goes over the options (the new ones among them), the
    # layers, the help page and the rename that failed in a fork: green.
    selected = "mlp or stripes or every_group or help_lists or layers or leaves_no_trace"
    tests = run([sys.executable, "-m", "pytest", "-n", "0", "-p", "no:cacheprovider", "-rA",
                 "-k", selected], project, **src)  # fmt: skip
    assert re.search(r"^=+ \d+ passed(, \d+ deselected)? in ", tests, re.M), tests[-3000:]
    cases = [
        "test_model_and_data_build_from_config[mlp-stripes]",
        "test_fast_dev_run_every_model[mlp]",
        "test_help_lists_every_option_of_every_group",
        "test_rename_leaves_no_trace_of_the_old_name",
        "test_every_import_runs_down_the_layers_and_none_goes_round",
    ]
    for case in cases:
        assert re.search(rf"^PASSED tests/\w+\.py::{re.escape(case)}$", tests, re.M), case

    # The new model learns the new data (a child of this process: torch is imported already).
    trained = run_forked(project / "train.py", ["model=mlp", "data=stripes", "trainer.max_epochs=3",
                         *QUIET], cwd=project, module_dir=project / "src", timeout=300)  # fmt: skip
    assert trained.returncode == 0, (trained.stdout + trained.stderr)[-3000:]
    assert float(re.search(r"test/acc (\d\.\d+)", trained.stdout)[1]) >= 0.9, trained.stdout
