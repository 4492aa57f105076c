"""Shared fixtures: compose the project's configs the way `python train.py` does."""

import functools
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, open_dict

import kindling.train  # noqa: F401 - registers the resolvers the configs use

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = ROOT / "configs"


def train_py(*args: str, cwd: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    """`python train.py <args>` in `cwd`, as a user runs it, with its output captured as text."""
    return subprocess.run(
        [sys.executable, str(ROOT / "train.py"), *args],
        cwd=cwd, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.fixture
def compose_config(tmp_path: Path) -> Callable[..., DictConfig]:
    """Compose `configs/train.yaml` with overrides, its run folder and data folder in tmp_path."""

    def _compose(*overrides: str) -> DictConfig:
        GlobalHydra.instance().clear()
        with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
            cfg = compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
        # What @hydra.main does before calling the task: ${hydra:...} resolves from HydraConfig,
        # and the task's config has no `hydra` key.
        HydraConfig().set_config(cfg)
        with open_dict(cfg):
            del cfg["hydra"]
            cfg.paths.output_dir = str(tmp_path / "run")
            cfg.paths.log_dir = str(tmp_path / "logs")
            cfg.paths.data_dir = str(tmp_path / "data")
        return cfg

    yield _compose
    GlobalHydra.instance().clear()


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
