"""Fixtures and pytest hooks. Helpers that are not fixtures are in helpers.py.

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
  folder (give a test-only run its own `paths.output_dir`); `helpers.copy_run(trained_run,
  folder)` copies it to resume or damage.
- `two_process_run`: `python train.py trainer.accelerator=cpu trainer.devices=2 debug=limit`,
  run once per session in its own folder (`.cwd`: the run folder is the one child of
  `logs/debug/runs/`), with its output (`.output`); it exited with 0.
- `gpu_trained_run`: the same run on the GPU (`trainer=gpu`), for the `gpu` tests of what
  follows training (prediction, export).
- `serve_folder(folder)`: an HTTP server for `folder` on 127.0.0.1 (a free port), stopped at
  teardown; returns its address and the paths asked of it.
- `slurm_cluster`: a one-node SLURM cluster started for the session (`tests/slurm_cluster.py`),
  or your own with KINDLING_SLURM_PARTITION; `.launcher(*overrides)` submits `train.py -m` there.

The suite runs in parallel (pytest-xdist; `-n` in pyproject.toml): a test uses only its own
tmp_path (or a session fixture like `trained_run`), never a fixed port or a file in the
repository, and may share a worker with any other test.
"""

import functools
import itertools
import os
import threading
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig

import kindling.train

from helpers import QUIET, TRAINED_RUN, TrainedRun, compose_in, made_once, train_py
from slurm_cluster import slurm_cluster  # noqa: F401 - a fixture


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--slow", action="store_true",
        help="also run the slow tests (real training runs, processes, the scheduler); "
        "CI runs them all",
    )  # fmt: skip


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """`pytest` runs the fast tests, `pytest --slow` all of them; `-m ...` chooses by itself.

    The slow tests run first, on every pytest-xdist worker at once: the workers share out the
    short ones at the end and finish together, instead of one running a minute-long test while
    the others wait."""
    if config.getoption("--slow") or config.getoption("-m"):
        slow = [item for item in items if item.get_closest_marker("slow")]
        fast = [item for item in items if not item.get_closest_marker("slow")]
        workers = getattr(config, "workerinput", {}).get("workercount", 1)
        items[:] = _slow_first_on_each_worker(slow, fast, workers)
        return
    slow = [item for item in items if item.get_closest_marker("slow")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("slow")]


def _slow_first_on_each_worker(
    slow: list[pytest.Item], fast: list[pytest.Item], workers: int
) -> list[pytest.Item]:
    """The order for `--dist worksteal`: it hands worker i the i-th of `workers` equal slices of
    the list, and later moves tests from the end of a busy worker's queue to an idle one. Each
    slice starts with its share of the slow tests, a module's together (they may share a module
    fixture), and ends with fast ones."""
    shares: list[list[pytest.Item]] = [[] for _ in range(workers)]
    for _, module in itertools.groupby(slow, key=lambda item: item.path):
        min(shares, key=len).extend(module)
    order, fast_left, left = [], iter(fast), len(slow) + len(fast)
    for worker, share in enumerate(shares):
        size = left // (workers - worker)  # as worksteal cuts its first slices
        order += [*share, *itertools.islice(fast_left, max(0, size - len(share)))]
        left -= size
    return order + list(fast_left)


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: a worker more than the cores. Many tests wait on processes they started (ranks
    connecting, a signal's effect, the scheduler); the extra worker runs a test meanwhile. On 2
    cores, `--slow` took 572 s with 3 workers, 624 s with 2 and 607 s with 4."""
    return len(os.sched_getaffinity(0)) + 1


def pytest_configure(config: pytest.Config) -> None:
    """In an xdist worker, share the cores out: N workers each running torch on every core
    would fight over them. Subprocesses (`python train.py`) inherit the setting. Without xdist
    (`-n0`), one thread: what a forked `train.py` runs with (tests/forked.py), so that a test
    comparing its weights with this process's compares the same sums."""
    workers = getattr(config, "workerinput", {}).get("workercount")
    threads = max(1, len(os.sched_getaffinity(0)) // workers) if workers else 1
    torch.set_num_threads(threads)
    os.environ["OMP_NUM_THREADS"] = str(threads)


@pytest.fixture
def compose_config(tmp_path: Path) -> Iterator[Callable[..., DictConfig]]:
    """Compose `configs/train.yaml` with overrides, its run folder and data folder in tmp_path."""
    yield functools.partial(compose_in, tmp_path)
    GlobalHydra.instance().clear()


def _trained_once(tmp_path_factory: pytest.TempPathFactory, trainer: str) -> TrainedRun:
    def train(folder: Path) -> float:
        return kindling.train.run(compose_in(folder, f"trainer={trainer}", *TRAINED_RUN))

    folder, value = made_once(tmp_path_factory, f"trained_run_{trainer}", train)
    return TrainedRun(folder / "run", value)


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> TrainedRun:
    return _trained_once(tmp_path_factory, "cpu")


@pytest.fixture(scope="session")
def gpu_trained_run(tmp_path_factory: pytest.TempPathFactory) -> TrainedRun:
    return _trained_once(tmp_path_factory, "gpu")


class ProcessRun(NamedTuple):
    cwd: Path  # where `python train.py` ran: its run folder is under logs/
    output: str  # its stdout and stderr


@pytest.fixture(scope="session")
def two_process_run(tmp_path_factory: pytest.TempPathFactory) -> ProcessRun:
    def train(folder: Path) -> str:
        args = ["trainer.accelerator=cpu", "trainer.devices=2", "debug=limit", *QUIET]
        result = train_py(*args, cwd=folder)
        assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
        return result.stdout + result.stderr

    return ProcessRun(*made_once(tmp_path_factory, "two_process_run", train))


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
