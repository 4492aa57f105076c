"""What tests share besides fixtures (those are in conftest.py). A test module imports its
helpers from here (`from helpers import QUIET, train_py`), never from another test module, so
that deleting one feature's tests leaves the others running.

Running train.py: `train_py_here(*args, cwd=...)` runs train.py's `__main__` with a command line
in this process (seconds of imports fewer), for what is about the command and its run;
`module_here(module, *args, cwd=...)` the same for `python -m <module>`. `train_py(*args,
cwd=...)` runs `python train.py` as a process of its own, forked from this one (`forked.py`), for
what is about the process itself (exit codes, signals, what happens at exit, output written
outside logging's handlers, several processes), and `start_train_py(*args, cwd=...)` starts it
(to signal it, or to run several at once); with `module_dir=` a config can name a class the
test wrote there (`TESTS` holds the callbacks of record_samples.py), `ctrl_c=True` gives it
Ctrl-C as in a terminal. `PYTHON` is the interpreter of commands that need a new one
(`[*PYTHON, script, *args]`: a new interpreter's imports or teardown, joblib's workers);
`QUIET` turns off the progress bar and model summary; `free_port()` is a port for a process
group of the test's own.

Configs: `compose_in(folder, *overrides)` composes `configs/train.yaml` as `python train.py`
does (the `compose_config` fixture calls it with tmp_path); `prepare_cfg(*overrides)` composes
`python -m kindling.prepare`'s config; `options(group)` lists a config group's options.

Results: `read_metrics(run_dir)` reads a run's `csv/metrics.csv` (`last_value` of a metric),
`read_csv(path)` any CSV file; `folder_contents(folder)` snapshots a folder to compare;
`in_folder(cfg, folder)` moves a composed run's folder;
`copy_run(trained_run, folder)` copies the shared trained run to resume or damage;
`made_once(tmp_path_factory, name, make)` makes a folder once per session, for every worker
(what session fixtures like `trained_run` share).

Trainers: `quiet_trainer(**settings)` for a test's own Trainer.

Data: `digits` sets up scikit-learn's digits; `pattern_rows` and `write_table` make a sequence
table, `data_module` sets one up; `make_folder` writes a folder of images, `datamodule` reads
one; `TINY_CORPUS` and `tiny_experiment` train a language model in seconds.

`ON_GPU` marks a test, or a parameter, `gpu` and skips it without CUDA.
"""

import contextlib
import csv
import io
import json
import logging
import os
import runpy
import shutil
import socket
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import lightning as L
import numpy as np
import pyarrow as pa
import pyarrow.csv
import pyarrow.parquet
import pytest
import torch
from filelock import FileLock
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict
from PIL import Image

import kindling.train  # noqa: F401 - registers the resolvers the configs use
from kindling.data.digits import DigitsDataModule
from kindling.data.image_folder import ImageFolderDataModule
from kindling.data.sequences import SequenceTableDataModule

from forked import Forked, run_forked

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
CONFIG_DIR = ROOT / "configs"
QUIET = ["callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null"]
# `@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=ON_GPU)])`.
ON_GPU = (pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))
# The `python` of the tests' subprocesses.
PYTHON: list[str] = [sys.executable]


# Processes


def running(pid: int) -> bool:
    """Whether `pid` runs (a zombie, ended and waiting to be reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def error_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The lines logged at ERROR or above: a refusal is exactly one."""
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]


def importable(module_dir: Path | None) -> dict[str, str] | None:
    """This environment with `module_dir` on PYTHONPATH (a run's ranks inherit it), so that a
    config can name a class a test wrote there: `+callbacks.x._target_=<module>.<Class>`."""
    if module_dir is None:
        return None
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(module_dir), env.get("PYTHONPATH")]))
    return env


def train_py(
    *args: str,
    cwd: Path,
    timeout: int = 600,
    module_dir: Path | None = None,
    new_interpreter: bool = False,
) -> subprocess.CompletedProcess:
    """`python train.py <args>` in `cwd` as a process of its own (forked: `forked.py`), with its
    output captured as text. `python` itself with `new_interpreter`, for what a fork cannot carry
    (joblib's pool of workers, whose threads the fork does not copy, waits for them forever), and
    where this process has started CUDA (a `gpu` test's), which a forked child cannot use."""
    if new_interpreter or torch.cuda.is_initialized():  # CUDA cannot start again in a fork
        return subprocess.run(
            [*PYTHON, str(ROOT / "train.py"), *args], cwd=cwd, env=importable(module_dir),
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
    return run_forked(ROOT / "train.py", list(args), cwd=cwd, env=importable(module_dir),
                      module_dir=module_dir, timeout=timeout)  # fmt: skip


def start_train_py(
    *args: str, cwd: Path, module_dir: Path | None = None, ctrl_c: bool = False
) -> Forked:
    """`python train.py <args>` started in `cwd` as a process of its own (forked: `forked.py`);
    its output (stdout and stderr) in `.stdout`.

    `ctrl_c`: SIGINT as in a terminal. A shell starts background jobs (a CI step, `cmd &`) with
    SIGINT ignored, and Python keeps an ignored SIGINT ignored.
    """
    return Forked(ROOT / "train.py", list(args), cwd=cwd, env=importable(module_dir),
                  module_dir=module_dir, merge_stderr=True, ctrl_c=ctrl_c)  # fmt: skip


@dataclass(frozen=True)
class CompletedRun:
    """What `train_py_here` and `module_here` return: a CompletedProcess's fields."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str


def train_py_here(*args: str, cwd: Path, module_dir: Path | None = None) -> CompletedRun:
    """`python train.py <args>` run as `__main__` in this process, which has imported what it
    needs: for what is about the run and its command line, not the process (several ranks,
    signals, a fresh interpreter's imports). Its output is what it printed and logged; an
    exception that escapes is printed as Python prints it, with exit status 1."""
    return main_here(lambda: runpy.run_path(str(ROOT / "train.py"), run_name="__main__"),
                     [str(ROOT / "train.py"), *args], cwd, module_dir)  # fmt: skip


def module_here(module: str, *args: str, cwd: Path) -> CompletedRun:
    """`python -m <module> <args>` as `train_py_here` runs train.py."""
    return main_here(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True),
                     [module, *args], cwd, None)  # fmt: skip


def main_here(
    main: Callable[[], object], argv: list[str], cwd: Path, module_dir: Path | None
) -> CompletedRun:
    """Run `main` with `argv` in `cwd`, then undo what it leaves in this process: Hydra's
    handlers on the root logger (the console's, train.log's) and its level, the global Hydra,
    the working folder, sys.argv and sys.path."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    saved_argv, saved_path, saved_cwd = sys.argv[:], sys.path[:], os.getcwd()
    stdout, stderr = io.StringIO(), io.StringIO()
    code: int | str | None = 0
    try:
        sys.argv[:] = argv
        if module_dir is not None:
            sys.path.insert(0, str(module_dir))
        os.chdir(cwd)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                main()
            except SystemExit as exit:
                code = exit.code
            except BaseException:  # uncaught in `python train.py`: Python prints it, exits 1
                traceback.print_exc()
                code = 1
            if isinstance(code, str):  # sys.exit("message"): printed, exit status 1
                print(code, file=sys.stderr)
                code = 1
    finally:
        for handler in root.handlers:
            if handler not in handlers:
                handler.close()
        root.handlers[:], root.level = handlers, level
        GlobalHydra.instance().clear()
        os.chdir(saved_cwd)
        sys.argv[:], sys.path[:] = saved_argv, saved_path
    return CompletedRun(argv[1:], code or 0, stdout.getvalue(), stderr.getvalue())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# Configs


def prepare_cfg(*overrides: str) -> DictConfig:
    """The config of `python -m kindling.prepare <overrides>`."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        return compose(config_name="prepare", overrides=list(overrides))


def compose_in(folder: Path, *overrides: str) -> DictConfig:
    """`configs/train.yaml` with overrides, its run, log and data folders under `folder`."""
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
    # What @hydra.main does before calling the task: ${hydra:...} resolves from HydraConfig,
    # and the task's config has no `hydra` key.
    HydraConfig().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
        cfg.paths.output_dir = str(folder / "run")
        cfg.paths.log_dir = str(folder / "logs")
        cfg.paths.data_dir = str(folder / "data")
    return cfg


def options(group: str) -> list[str]:
    """The options of a config group: the yaml files in configs/<group>/."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


# A copy of the repository


def copy_tracked_files(destination: Path) -> Path:
    """The repository as git knows it (tracked files, as they are in the working tree)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():  # a tracked file deleted in the working tree is left out
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)
    return destination


def git(repo: Path, *args: str) -> str:
    identity = ["-c", "user.name=test", "-c", "user.email=test@example.com"]
    result = subprocess.run(["git", *identity, *args], cwd=repo, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


# Runs


@dataclass(frozen=True)
class TrainedRun:
    run_dir: Path  # the run folder: checkpoints/, csv/metrics.csv, ...
    value: float  # what kindling.train.run returned: the optimized metric, val/acc_best

    @property
    def last_checkpoint(self) -> Path:
        return self.run_dir / "checkpoints" / "last.ckpt"

    @property
    def best_checkpoint(self) -> Path:
        (best,) = (self.run_dir / "checkpoints").glob("epoch_*.ckpt")
        return best


TRAINED_RUN = ["trainer.max_epochs=4", *QUIET]


def made_once(
    tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object]
) -> tuple[Path, object]:
    """The folder `name` and what `make(folder)` returned (JSON), made by whichever pytest-xdist
    worker asks first; the others wait for it and read it. Made once per session, not per worker."""
    if "PYTEST_XDIST_WORKER" not in os.environ:  # one process: its own temporary folder
        folder = tmp_path_factory.mktemp(name)
        return folder, make(folder)
    # Workers of one session share the parent of their temporary folders.
    folder = tmp_path_factory.getbasetemp().parent / name
    done = folder.with_name(f"{name}.json")
    with FileLock(str(folder) + ".lock"):
        if not done.is_file():
            folder.mkdir(exist_ok=True)
            done.write_text(json.dumps(make(folder)))
    return folder, json.loads(done.read_text())


def copy_run(trained: TrainedRun, folder: Path) -> Path:
    """A copy of `trained`'s run folder at `folder`, with the `.hydra/` that `python train.py`
    leaves in a run folder (so resuming it continues there)."""
    shutil.copytree(trained.run_dir, folder)
    (folder / ".hydra").mkdir(exist_ok=True)
    return folder


def in_folder(cfg: DictConfig, folder: Path) -> DictConfig:
    """`cfg` with its run folder at `folder`."""
    with open_dict(cfg):
        cfg.paths.output_dir = str(folder)
    return cfg


def folder_contents(folder: Path, but: tuple[str, ...] = ()) -> dict[str, bytes]:
    """Every file's bytes (a folder as `<folder>`) by relative path, but the names in `but`."""
    return {
        str(path.relative_to(folder)): path.read_bytes() if path.is_file() else b"<folder>"
        for path in folder.rglob("*")
        if path.name not in but
    }


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def read_metrics(run_dir: Path) -> list[dict[str, str]]:
    """The rows of a run's `csv/metrics.csv`."""
    return read_csv(run_dir / "csv" / "metrics.csv")


def last_value(rows: list[dict[str, str]], name: str) -> float:
    """The last value of metric `name` in `rows` of metrics.csv."""
    return float([row[name] for row in rows if row.get(name)][-1])


def quiet_trainer(**settings: object) -> L.Trainer:
    """A CPU Trainer that logs, checkpoints, draws and summarises nothing unless `settings` say."""
    quiet = {"accelerator": "cpu", "logger": False, "enable_checkpointing": False,
             "enable_progress_bar": False, "enable_model_summary": False}  # fmt: skip
    return L.Trainer(**{**quiet, **settings})


# Scikit-learn's digits (data=digits)


def digits(folder: Path, accelerator: str = "cpu", **kwargs) -> DigitsDataModule:
    """The digits (10 classes of 1x8x8 images) in batches of 100 unless `batch_size` says, set
    up under a one-device Trainer of `accelerator` (which decides where on-device data lives)."""
    dm = DigitsDataModule(str(folder), 10, [1, 8, 8], **{"batch_size": 100, **kwargs})
    dm.trainer = L.Trainer(accelerator=accelerator, devices=1, logger=False, barebones=True)
    dm.setup()
    return dm


# A sequence table (data=sequences)

CLASSES = ("down", "flat", "up")  # what a bump at a random step does to the first feature


def pattern_rows(count: int, seed: int, lengths: tuple[int, int] = (5, 50)) -> list[dict]:
    """`count` sequences, one row per step, in a shuffled order. A sequence's class is the sign
    of a three-step bump in feature `x` (or a bump in `y` for `flat`) at a random position; `z`
    is noise, with an offset so that standardising matters."""
    rng = np.random.default_rng(seed)
    rows = []
    for number in range(count):
        label = CLASSES[number % 3]
        length = int(rng.integers(*lengths, endpoint=True))
        x, y = rng.normal(0, 0.3, (2, length))
        start = int(rng.integers(0, length - 2))
        bump = slice(start, start + 3)
        if label == "flat":
            y[bump] += 3.0
        else:
            x[bump] += 3.0 if label == "up" else -3.0
        z = rng.normal(50.0, 10.0, length)
        rows += [{"id": f"s{number}", "time": t, "label": label, "x": x[t], "y": y[t], "z": z[t]}
                 for t in range(length)]  # fmt: skip
    order = rng.permutation(len(rows))
    return [rows[i] for i in order]


def write_table(rows: list[dict], path: Path) -> Path:
    """The rows as CSV or Parquet (by the suffix), columns in the first row's order."""
    names = list(rows[0]) if rows else ["id", "time", "label", "x"]
    table = pa.table({name: [row.get(name) for row in rows] for name in names})
    if path.suffix == ".parquet":
        pyarrow.parquet.write_table(table, path)
    else:
        pyarrow.csv.write_csv(table, path)
    return path


def data_module(path: Path, **options) -> SequenceTableDataModule:
    """The sequence table at `path`, set up."""
    options = {"num_features": 3, "num_classes": 3, **options}
    module = SequenceTableDataModule(str(path), **options)
    module.setup()
    return module


# A folder of images (data=image_folder)

COLOURS = {"blue": (20, 40, 220), "green": (30, 200, 40), "red": (220, 30, 30)}


def write_image(path: Path, colour: tuple[int, int, int], size=(10, 12), mode="RGB", seed=0):
    """A noisy image of one colour (PNG or JPEG by suffix), of any size and PIL mode."""
    noise = np.random.default_rng(seed).integers(0, 50, (size[1], size[0], 3))
    pixels = np.clip(np.array(colour) * 0.8 + noise, 0, 255).astype(np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).convert(mode).save(path)


def make_folder(root: Path, per_class: int = 6, splits: tuple[str, ...] = ()) -> Path:
    """`root/<class>/` (or `root/<split>/<class>/` for each split) of PNG and JPEG files."""
    for split in splits or ("",):
        for name, colour in COLOURS.items():
            for i in range(per_class):
                suffix = ".png" if i % 2 else ".jpg"
                write_image(root / split / name / f"{i}{suffix}", colour, seed=i)
    return root


def datamodule(path: Path, **kwargs) -> ImageFolderDataModule:
    """The image folder at `path`, 8x8 images in batches of 4, not set up."""
    args = {"num_classes": 3, "image_size": 8, "batch_size": 4, "num_workers": 0} | kwargs
    return ImageFolderDataModule(str(path), **args)


# A text corpus (experiment=charlm)

# A tiny corpus to memorise: varied enough that guessing by letter frequency is far off.
TINY_CORPUS = (
    "Beautiful is better than ugly. Explicit is better than implicit. Simple is better than "
    "complex. Complex is better than complicated. Flat is better than nested. Sparse is better "
    "than dense. Readability counts. Special cases aren't special enough to break the rules. "
    "Although practicality beats purity. Errors should never pass silently. Unless explicitly "
    "silenced. In the face of ambiguity, refuse the temptation to guess.\n"
)


def tiny_experiment(family: str, corpus: Path, *extra: str, trainer: str = "cpu") -> list[str]:
    """`experiment=charlm` at a size that trains in seconds on a CPU."""
    sizes = {
        "transformer": ["model.net.d_model=32", "model.net.num_layers=1", "model.net.num_heads=2"],
    }.get(family, ["model.net.hidden_size=32", "model.net.num_layers=1"])
    return [
        "experiment=charlm",
        f"model=lm/{family}",
        f"data.path={corpus}",
        "data.context_length=16",
        "data.batch_size=4",
        f"trainer={trainer}",
        "trainer.max_epochs=2",
        "trainer.limit_train_batches=4",
        "model.sample_length=20",
        *sizes,
        *QUIET,
        *extra,
    ]
