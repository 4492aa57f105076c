"""Each run records what produced it: command line, git commit and diff, versions."""

import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from kindling.run import provenance
from kindling.train import run

from helpers import QUIET


def git(folder: Path, *args: str) -> str:
    command = ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t", *args]
    return subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def repository(tmp_path: Path, monkeypatch) -> Path:
    """A git checkout with one commit; git looks no further up than tmp_path."""
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    folder = tmp_path / "repo"
    (folder / "pkg").mkdir(parents=True)
    (folder / "pkg" / "model.py").write_text("width = 64\n")
    git(folder, "init", "-q")
    git(folder, "add", ".")
    git(folder, "commit", "-q", "-m", "first")
    return folder


def test_a_clean_checkout_records_its_commit(repository: Path) -> None:
    state = provenance.git_state(repository / "pkg")
    assert state == {
        "commit": git(repository, "rev-parse", "HEAD"),
        "dirty": False,
        "diff": None,
        "untracked": [],
    }


def test_a_dirty_checkout_records_the_diff_and_new_files(repository: Path, tmp_path) -> None:
    (repository / "pkg" / "new.py").write_text("")
    assert provenance.git_state(repository / "pkg")["dirty"] is True  # a new file alone
    (repository / "pkg" / "model.py").write_text("width = 128\n")
    state = provenance.git_state(repository / "pkg")
    assert state["dirty"] is True
    assert "-width = 64\n+width = 128" in state["diff"]
    assert state["untracked"] == ["pkg/new.py"]
    record = {**provenance.collect(repository / "pkg"), "git": state}
    provenance.save(record, tmp_path / "run")
    saved = yaml.safe_load((tmp_path / "run" / "provenance.yaml").read_text())
    assert saved["git"]["diff"] == "git.diff"
    assert (tmp_path / "run" / "git.diff").read_text() == state["diff"]


def test_outside_a_checkout_there_is_no_git(repository: Path, tmp_path: Path, monkeypatch) -> None:
    assert provenance.git_state(tmp_path)["commit"] == "no git"
    # An installed copy is not the checkout its virtual environment may sit in.
    installed = repository / ".venv" / "lib" / "site-packages" / "pkg"
    installed.mkdir(parents=True)
    assert provenance.git_state(installed)["commit"] == "no git"
    monkeypatch.setenv("PATH", "")  # no git program at all
    assert provenance.git_state(Path(__file__).parent)["commit"] == "no git"


def test_the_record_names_command_and_versions(monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["train.py", "model=lstm", "data.path=a b.txt"])
    record = provenance.collect()
    assert record["command"].endswith("train.py model=lstm 'data.path=a b.txt'")
    assert record["versions"]["torch"] == torch.__version__
    assert record["versions"]["cuda"] == torch.version.cuda
    assert set(record["versions"]) == {"python", "kindling", "torch", "cuda", "lightning", "hydra"}


def test_a_run_records_its_provenance(compose_config, tmp_path: Path) -> None:
    run(compose_config("trainer=cpu", "debug=limit", "trainer.max_epochs=1", "test=false", *QUIET))
    run_dir = tmp_path / "run"
    saved = yaml.safe_load((run_dir / "provenance.yaml").read_text())
    assert saved["versions"]["lightning"]
    assert saved["git"]["commit"]  # a sha in a checkout, "no git" in an installed copy
    checkpoint = torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)
    assert checkpoint["provenance"]["command"] == saved["command"]
    assert checkpoint["provenance"]["git"]["commit"] == saved["git"]["commit"]
    hparams = yaml.safe_load((run_dir / "csv" / "hparams.yaml").read_text())
    assert hparams["provenance"]["versions"] == saved["versions"]
    # The data it trained on, as the checkpoint keeps it for a resume's check.
    assert saved["data"] == checkpoint["provenance"]["data"]
    assert set(saved["data"]) >= {"train", "val", "test"}, saved["data"]
