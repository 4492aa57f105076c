"""scripts/rename_package.py and copier.yml on a copy of the repository: everything renamed,
still trains, and kindling's later changes still reach the renamed project."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import PYTHON, QUIET, ROOT, copy_tracked_files, git

SCRIPT = ROOT / "scripts" / "rename_package.py"


def rename(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *args, "--root", str(repo)],
        capture_output=True, text=True,
    )  # fmt: skip


def snapshot(repo: Path) -> dict[str, bytes]:
    return {str(p.relative_to(repo)): p.read_bytes() for p in repo.rglob("*") if p.is_file()}


def files_mentioning(repo: Path, word: str) -> list[str]:
    """Files naming `word`, but copier's record of where a project came from, which must."""
    pattern = re.compile(rf"\b{word}\b".encode())
    found = [name for name, data in snapshot(repo).items() if pattern.search(data)]
    return [name for name in found if name != ".copier-answers.yml"]


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    return copy_tracked_files(tmp_path / "repo")


def test_dry_run_lists_the_changes_and_writes_nothing(repo: Path) -> None:
    before = snapshot(repo)
    result = rename(repo, "mynet", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert "src/kindling -> src/mynet" in result.stdout
    assert re.search(r"^pyproject.toml: \d+ replaced$", result.stdout, re.MULTILINE)
    assert re.search(r"^configs/model/cnn.yaml: \d+ replaced$", result.stdout, re.MULTILINE)
    assert snapshot(repo) == before


def test_rename_leaves_no_trace_of_the_old_name(repo: Path) -> None:
    assert files_mentioning(repo, "kindling")  # the test means something
    result = rename(repo, "mynet")
    assert result.returncode == 0, result.stderr
    assert not (repo / "src" / "kindling").exists()
    assert (repo / "src" / "mynet" / "train.py").is_file()
    assert files_mentioning(repo, "kindling") == []
    assert 'name = "mynet"' in (repo / "pyproject.toml").read_text()
    assert (
        "_target_: mynet.models.cnn.CNNClassifier" in (repo / "configs/model/cnn.yaml").read_text()
    )
    assert 'import_long_lived("mynet.train")' in (repo / "train.py").read_text()


@pytest.mark.parametrize("name", ["My-Net", "2net", "class", "kindling"])
def test_bad_names_are_refused(repo: Path, name: str) -> None:
    before = snapshot(repo)
    result = rename(repo, name)
    assert result.returncode == 2
    assert snapshot(repo) == before


@pytest.mark.slow
def test_renamed_project_trains(repo: Path) -> None:
    assert rename(repo, "mynet").returncode == 0
    # The renamed package is imported from the copy; kindling, installed in this environment, is
    # never named by the copy any more (previous test), so it cannot stand in for it.
    env = {**os.environ, "PYTHONPATH": str(repo / "src")}
    result = subprocess.run(
        [*PYTHON, "train.py", "debug=fdr", "trainer=cpu", *QUIET],
        cwd=repo, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, (result.stdout + result.stderr)[-3000:]
    assert (
        "mynet.modules.classifier.Classifier"
        in next((repo / "logs").rglob("config.yaml")).read_text()
    )


def test_renamed_fork_still_merges_upstream_fixes(repo: Path) -> None:
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "upstream")
    git(repo, "checkout", "-q", "-b", "fork")
    assert rename(repo, "mynet").returncode == 0
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "rename to mynet")
    # Upstream fixes a line of a file the fork has moved.
    git(repo, "checkout", "-q", "main")
    train = repo / "src" / "kindling" / "train.py"
    fixed = train.read_text().replace('"""The path of a run', '"""The path of one run', 1)
    assert fixed != train.read_text()
    train.write_text(fixed)
    git(repo, "commit", "-q", "-am", "upstream fix")
    git(repo, "checkout", "-q", "fork")
    git(repo, "merge", "-q", "--no-edit", "main")
    merged = (repo / "src" / "mynet" / "train.py").read_text()
    assert merged.startswith('"""The path of one run')
    assert not (repo / "src" / "kindling").exists()


def copier(*args: str, cwd: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "copier", *args, "--trust", "--defaults"],
        cwd=cwd, capture_output=True, text=True,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
@pytest.mark.skipif(
    not (ROOT / "copier.yml").is_file(),
    reason="this repository is no copier template (no copier.yml): a project copied has none",
)
def test_a_copier_project_takes_kindlings_later_changes_renamed(tmp_path) -> None:
    """`copier copy` starts a renamed project; `copier update` brings in what kindling changed
    since, new files and new imports renamed too, and keeps the project's own changes. The
    template is a folder named `kindling`, as a clone is: the answers file keeps its path."""
    pytest.importorskip("copier")
    repo = copy_tracked_files(tmp_path / "upstream" / "kindling")
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", ".")
    git(repo, "commit", "-q", "-m", "kindling v1")
    git(repo, "tag", "v1")
    project = tmp_path / "project"
    copier(
        "copy", "--vcs-ref=v1", "--data=package_name=mynet", str(repo), str(project), cwd=tmp_path
    )
    assert (project / "src" / "mynet" / "train.py").is_file()
    assert not (project / "src" / "kindling").exists()
    assert files_mentioning(project, "kindling") == []
    assert "/kindling" in (project / ".copier-answers.yml").read_text()  # the template's path
    git(project, "init", "-q", "-b", "main")
    # The project's own work: a model of its own, an edit of a kindling file.
    (project / "src" / "mynet" / "models" / "mine.py").write_text('"""My model."""\n')
    train = project / "src" / "mynet" / "train.py"
    train.write_text(train.read_text().replace('"""The path of a run', '"""The path of my run', 1))
    git(project, "add", "-A")
    git(project, "commit", "-q", "-m", "my project")

    # kindling, later: a fix in a file, and a new module importing the package.
    fixed = repo / "src" / "kindling" / "errors.py"
    fixed.write_text(fixed.read_text().replace('"""Errors caused', '"""Errors, caused', 1))
    new = repo / "src" / "kindling" / "models" / "block.py"
    new.write_text('"""A block."""\n\nfrom kindling.models.cnn import CNNClassifier\n')
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "kindling v2")
    git(repo, "tag", "v2")
    copier("update", "--vcs-ref=v2", cwd=project)

    package = project / "src" / "mynet"
    assert (package / "errors.py").read_text().startswith('"""Errors, caused')
    assert (
        "from mynet.models.cnn import CNNClassifier"
        in (package / "models" / "block.py").read_text()
    )
    assert train.read_text().startswith('"""The path of my run')
    assert (package / "models" / "mine.py").is_file()
    assert not (project / "src" / "kindling").exists()
    assert files_mentioning(project, "kindling") == []
