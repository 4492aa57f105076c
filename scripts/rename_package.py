"""Rename the package `kindling` to your project's name, everywhere, in one go.

    python scripts/rename_package.py myproject --dry-run   # list what would change
    python scripts/rename_package.py myproject             # do it
    pip uninstall -y kindling && pip install -e ".[dev]"   # install under the new name

It moves `src/kindling/` to `src/myproject/` and replaces the word `kindling` (whole words only:
imports, `_target_:` paths in configs, pyproject.toml, README, Makefile, Dockerfile, ...) in every
text file of the project. Run it on a clean working tree and commit the result on its own, so
that `git merge upstream/main` can still follow the moved files. `copier copy` runs it as its task
(copier.yml; README: Your own project).
"""

import argparse
import keyword
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Never touched: version control, environments, caches.
SKIP_ANYWHERE = {".git", ".venv", "venv", "__pycache__", ".pytest_cache", ".ruff_cache"}
# Never touched at the top level: runs, data sets, build output, and copier's record of where
# the template is (a clone named kindling: renamed, `copier update` would not find it).
SKIP_AT_ROOT = {"logs", "data", "outputs", "multirun", "build", "dist", ".copier-answers.yml"}


def valid_name(name: str) -> bool:
    """A lowercase Python identifier that is not a keyword: importable and pip-installable."""
    return re.fullmatch(r"[a-z_][a-z0-9_]*", name) is not None and not keyword.iskeyword(name)


def project_files(root: Path) -> list[Path]:
    """Every file of the project, outside the skipped folders, in a stable order."""
    files = []
    for path in sorted(root.rglob("*")):
        parts = path.relative_to(root).parts
        if parts[0] in SKIP_AT_ROOT or any(
            part in SKIP_ANYWHERE or part.endswith(".egg-info") for part in parts
        ):
            continue
        if path.is_file():
            files.append(path)
    return files


def read_text(path: Path) -> str | None:
    """The file's text, or None for binary files (images, checkpoints), which stay as they are."""
    data = path.read_bytes()
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def rename(root: Path, old: str, new: str, dry_run: bool) -> list[str]:
    """Replace `old` by `new` in text files, then move paths named `old`; return what changed."""
    word = re.compile(rf"\b{re.escape(old)}\b")
    changes = []
    for path in project_files(root):
        text = read_text(path)
        if text is None:
            continue
        new_text, count = word.subn(new, text)
        if count:
            changes.append(f"{path.relative_to(root)}: {count} replaced")
            if not dry_run:
                path.write_text(new_text, encoding="utf-8")
    # Deepest first, so a folder moves after whatever it contains.
    named_old = [p for p in project_files(root) if old in p.relative_to(root).parts]
    folders = sorted({_first_named(p, root, old) for p in named_old}, key=lambda p: -len(p.parts))
    for folder in folders:
        target = folder.with_name(new)
        changes.append(f"{folder.relative_to(root)} -> {target.relative_to(root)}")
        if not dry_run:
            _move(folder, target)
    return changes


def _move(folder: Path, target: Path) -> None:
    """Move `folder` to `target`; into it, file by file, where it exists (`copier update` writes
    kindling's new version beside the renamed package, and this task moves it in)."""
    if not target.exists():
        folder.rename(target)
        return
    for path in [p for p in folder.rglob("*") if p.is_file()]:
        moved = target / path.relative_to(folder)
        moved.parent.mkdir(parents=True, exist_ok=True)
        path.replace(moved)
    shutil.rmtree(folder)


def _first_named(path: Path, root: Path, name: str) -> Path:
    parts = path.relative_to(root).parts
    return root.joinpath(*parts[: parts.index(name) + 1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("new", help="the new package name, e.g. myproject")
    parser.add_argument("--old", default="kindling", help="the current name (default: kindling)")
    parser.add_argument("--root", type=Path, default=ROOT, help="the project folder")
    parser.add_argument("--dry-run", action="store_true", help="only list what would change")
    args = parser.parse_args(argv)

    if not valid_name(args.new):
        print(f"{args.new!r} is not a valid package name: use lowercase letters, digits and _.")
        return 2
    if args.new == args.old:
        print(f"The package is named {args.old} already: give another name.")
        return 2
    root = args.root.resolve()
    if not (root / "src" / args.old).is_dir():
        print(f"{root / 'src' / args.old} does not exist: nothing named {args.old!r} to rename.")
        return 2
    changes = rename(root, args.old, args.new, args.dry_run)
    print("\n".join(changes))
    if args.dry_run:
        print(f"Dry run: {len(changes)} changes listed, nothing written.")
    else:
        print(f"Renamed {args.old} to {args.new}. Reinstall under the new name:")
        print(f"  pip uninstall -y {args.old} && pip install -e '.[dev]'")
    return 0


if __name__ == "__main__":
    sys.exit(main())
