"""Wheels for a GPU machine without network: what kindling needs and that machine lacks.

    python benchmarks/gpu_wheels.py                        # into .whl/ (git-ignored)
    python benchmarks/gpu_wheels.py --have my_machine.txt --python-version 3.12

Run it where the package registry is reachable, in an environment where kindling is installed
(`pip install -e ".[dev]"`): it follows kindling's runtime requirements, and the test runner's,
through the installed packages' metadata, leaves out what the offline machine has (the names in
`--have`, by default `benchmarks/gpu_machine.txt`), and downloads each remaining package at the
version installed here (the versions the suite passed with), as a wheel for the offline
machine's Python on x86-64 Linux. A package published only as source (antlr4-python3-runtime
4.9.3, which Hydra pins) is built into a wheel here, which works only for pure-Python packages.

`.whl/` then travels with the working tree; `bash benchmarks/gpu_check.sh` installs it there
with `pip install --no-index --no-deps --target` and puts it on PYTHONPATH.
"""

import argparse
import importlib.metadata as metadata
import re
import shutil
import subprocess
import sys
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
# Besides kindling's own requirements: what `pytest -m gpu` imports. Collecting the gpu tests
# imports every test module, so a package any of them imports at the top is needed too.
TEST_RUNNER = ["pytest", "pytest-xdist", "filelock", "jsonschema"]
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in (17, 24, 27, 28, 31, 34, 35, 39)]
PLATFORMS += ["manylinux2014_x86_64", "manylinux1_x86_64"]


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def missing_requirements(roots: list[str], have: set[str]) -> dict[str, str]:
    """Every installed distribution that `roots` need and `have` lacks, with its installed
    version, following requirements whose environment markers hold here (extras' requirements
    left out). A package in `have` brings its own requirements there: they are not followed."""
    found: dict[str, str] = {}
    queue = list(roots)
    while queue:
        name = normalise(queue.pop())
        if name in found or name in have:
            continue
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue  # an optional dependency not installed here: not needed
        for line in metadata.requires(name) or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                queue.append(requirement.name)
    return found


def machine_packages(path: Path) -> set[str]:
    """Package names, one per line (`name` or `name==version`), `#` comments ignored."""
    names = set()
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            names.add(normalise(re.split(r"[=<>~! @]", line, maxsplit=1)[0]))
    return names


def download(name: str, version: str, python_version: str, dest: Path) -> None:
    pip = [sys.executable, "-m", "pip"]
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    binary = [
        *pip, "download", "--quiet", "--no-deps", "--only-binary=:all:", "--implementation", "cp",
        "--python-version", python_version, *platforms, "--dest", str(dest), f"{name}=={version}",
    ]  # fmt: skip
    if subprocess.run(binary, capture_output=True, text=True).returncode == 0:
        return
    # Published as source only: build the wheel here (pure-Python packages only).
    built = [*pip, "wheel", "--quiet", "--no-deps", "--wheel-dir", str(dest), f"{name}=={version}"]
    subprocess.run(built, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--have", type=Path, default=ROOT / "benchmarks" / "gpu_machine.txt")
    parser.add_argument("--python-version", default="3.12", help="the offline machine's Python")
    parser.add_argument("--dest", type=Path, default=ROOT / ".whl")
    args = parser.parse_args()

    have = machine_packages(args.have)
    missing = missing_requirements(["kindling", *TEST_RUNNER], have)
    missing.pop("kindling")  # it travels as source, on PYTHONPATH
    if args.dest.exists():
        shutil.rmtree(args.dest)  # one version of each: two stop the offline install
    args.dest.mkdir(parents=True)
    for name, version in sorted(missing.items()):
        download(name, version, args.python_version, args.dest)
        print(f"{name}=={version}")
    size = sum(path.stat().st_size for path in args.dest.iterdir())
    print(f"{len(missing)} wheels, {size / 1e6:.1f} MB in {args.dest}")


if __name__ == "__main__":
    main()
