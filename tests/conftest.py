"""Shared fixtures and helpers. Use them in new tests rather than training or composing anew.

Fixtures:
- `compose_config(*overrides)`: `configs/train.yaml` composed with overrides, as `python
  train.py` composes it, with the run folder (`tmp_path/run`), log and data folders in tmp_path.
  Pass the result to `kindling.train.run(cfg)` to train in-process (no `python train.py`
  subprocess, which pays ~6 s of imports).
- `trained_run`: one default classifier run (digits, CNN, `trainer=cpu trainer.max_epochs=4`,
  then tested), trained once per test session and shared by every pytest-xdist worker. Its
  `.run_dir` holds `checkpoints/last.ckpt`, the best `checkpoints/epoch_*.ckpt`,
  `csv/metrics.csv` (train, val and test rows); `.value` is what `run` returned (val/acc_best).
  Tests that only read a trained checkpoint or its metrics use it; they must not write into its
  folder (give a test-only run its own `paths.output_dir`); `copy_run(trained_run, folder)`
  copies it to resume or damage.
- `gpu_trained_run`: the same run on the GPU (`trainer=gpu`), for the `gpu` tests of what
  follows training (prediction, export).
- `serve_folder(folder)`: an HTTP server for `folder` on 127.0.0.1 (a free port), stopped at
  teardown; returns its address and the paths asked of it.
- `slurm_cluster`: a one-node SLURM cluster started for the session (`tests/slurm_cluster.py`),
  or your own with KINDLING_SLURM_PARTITION; `.launcher(*overrides)` submits `train.py -m` there.

Helpers: `train_py(*args, cwd=...)` runs `python train.py` as a user does, for what is about the
process itself (exit codes, signals, console output, several processes), and
`start_train_py(*args, cwd=...)` starts it (to signal it, or to run several at once); with
`module_dir=` a config can name a class the test wrote there, `ctrl_c=True` gives it Ctrl-C as
in a terminal. `PYTHON` is the interpreter of such commands (`[*PYTHON, script, *args]`).
`QUIET` turns off the progress bar and model summary;
`ON_GPU` marks a test, or a parameter, `gpu` and skips it without CUDA;
`options(group)` lists the options of a config group; `prepare_cfg(*overrides)` composes
`python -m kindling.prepare`'s config; `ROOT` and `CONFIG_DIR` locate the repository.

The suite runs in parallel (pytest-xdist; `-n` in pyproject.toml): a test uses only its own
tmp_path (or a session fixture like `trained_run`), never a fixed port or a file in the
repository, and may share a worker with any other test.
"""

import functools
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

import kindling.train  # also registers the resolvers the configs use

from slurm_cluster import slurm_cluster  # noqa: F401 - a fixture

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"
QUIET = ["callbacks.rich_progress_bar=null", "callbacks.rich_model_summary=null"]
# `@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=ON_GPU)])`.
ON_GPU = (pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"))
# The `python` of the tests' subprocesses.
PYTHON: list[str] = [sys.executable]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow", action="store_true",
        help="also run the slow tests (real training runs, several processes, the scheduler); "
        "CI runs them all",
    )  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`pytest` runs the fast tests, `pytest --slow` all of them; `-m ...` chooses by itself."""
    if config.getoption("--slow") or config.getoption("-m"):
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


def pytest_configure(config: pytest.Config) -> None:
    """In an xdist worker, share the cores out: N workers each running torch on every core
    would fight over them. Subprocesses (`python train.py`) inherit the setting."""
    workers = getattr(config, "workerinput", {}).get("workercount")
    if workers:
        threads = max(1, len(os.sched_getaffinity(0)) // workers)
        torch.set_num_threads(threads)
        os.environ["OMP_NUM_THREADS"] = str(threads)


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
    *args: str, cwd: Path, timeout: int = 600, module_dir: Path | None = None
) -> subprocess.CompletedProcess:
    """`python train.py <args>` in `cwd`, as a user runs it, with its output captured as text."""
    return subprocess.run(
        [*PYTHON, str(ROOT / "train.py"), *args],
        cwd=cwd, env=importable(module_dir), capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


def start_train_py(
    *args: str, cwd: Path, module_dir: Path | None = None, ctrl_c: bool = False
) -> subprocess.Popen:
    """`python train.py <args>` started in `cwd`; its output (stdout and stderr) piped as text.

    `ctrl_c`: SIGINT as in a terminal. A shell starts background jobs (a CI step, `cmd &`) with
    SIGINT ignored, and Python keeps an ignored SIGINT ignored.
    """
    return subprocess.Popen(
        [*PYTHON, str(ROOT / "train.py"), *args],
        cwd=cwd, env=importable(module_dir), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, preexec_fn=_default_sigint if ctrl_c else None,
    )  # fmt: skip


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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


@pytest.fixture
def compose_config(tmp_path: Path) -> Iterator[Callable[..., DictConfig]]:
    """Compose `configs/train.yaml` with overrides, its run folder and data folder in tmp_path."""
    yield functools.partial(compose_in, tmp_path)
    GlobalHydra.instance().clear()


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


def _train(folder: Path, trainer: str) -> TrainedRun:
    value = kindling.train.run(compose_in(folder, f"trainer={trainer}", *TRAINED_RUN))
    return TrainedRun(folder / "run", value)


def _trained_once(tmp_path_factory: pytest.TempPathFactory, trainer: str) -> TrainedRun:
    """Trained by whichever worker asks first; the others wait and read it."""
    name = f"trained_run_{trainer}"
    if "PYTEST_XDIST_WORKER" not in os.environ:  # one process: its own temporary folder
        return _train(tmp_path_factory.mktemp(name), trainer)
    # Workers of one session share the parent of their temporary folders.
    folder = tmp_path_factory.getbasetemp().parent / name
    done = folder / "value.json"
    with FileLock(str(folder) + ".lock"):
        if not done.is_file():
            trained = _train(folder, trainer)
            done.write_text(json.dumps(trained.value))
    return TrainedRun(folder / "run", json.loads(done.read_text()))


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> TrainedRun:
    return _trained_once(tmp_path_factory, "cpu")


@pytest.fixture(scope="session")
def gpu_trained_run(tmp_path_factory: pytest.TempPathFactory) -> TrainedRun:
    return _trained_once(tmp_path_factory, "gpu")


def copy_run(trained: TrainedRun, folder: Path) -> Path:
    """A copy of `trained`'s run folder at `folder`, with the `.hydra/` that `python train.py`
    leaves in a run folder (so resuming it continues there)."""
    shutil.copytree(trained.run_dir, folder)
    (folder / ".hydra").mkdir(exist_ok=True)
    return folder


def options(group: str) -> list[str]:
    """The options of a config group: the yaml files in configs/<group>/."""
    return sorted(p.stem for p in (CONFIG_DIR / group).glob("*.yaml"))


class _RecordingHandler(SimpleHTTPRequestHandler):
    """Serves a folder, records the paths asked for, logs nothing."""

    def do_GET(self) -> None:
        self.server.requested.append(self.path)
        super().do_GET()

    def log_message(self, format: str, *args) -> None:
        pass


@pytest.fixture
def serve_folder() -> Iterator[Callable[[Path], tuple[str, list[str]]]]:
    """`serve(folder)` starts an HTTP server for `folder` on 127.0.0.1.

    Returns its base address and the list of paths requested from it; stopped at teardown.
    """
    running: list[tuple[ThreadingHTTPServer, threading.Thread]] = []

    def serve(folder: Path) -> tuple[str, list[str]]:
        handler = functools.partial(_RecordingHandler, directory=str(folder))
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        server.requested = []
        # A short poll interval: shutdown() at teardown waits up to one interval.
        thread = threading.Thread(target=server.serve_forever, args=(0.01,), daemon=True)
        thread.start()
        running.append((server, thread))
        host, port = server.server_address[:2]
        return f"http://{host}:{port}/", server.requested

    yield serve
    for server, thread in running:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
