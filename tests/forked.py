"""`python <script> <args>` (or `python -m <module> <args>`) as a child forked from the test's
process, which has imported torch, Lightning and kindling already: a process of its own (its
pid, signals, process group, exit status, its output on its own file descriptors, the ranks it
starts), without the seconds of CPU a new interpreter spends on those imports before it runs,
for every such process of `pytest --slow`. `Forked` has the face of `subprocess.Popen` that the
tests use.

The child is made to look like a new interpreter where a script can tell: the working folder,
environment and `sys.argv` of the command; standard streams on its own descriptors (and the
logging handlers that wrote to the test's); Python's signal handlers, warning filters and hooks
rather than pytest's; no atexit handler of the test's. What it cannot look like is what a test of
a new interpreter's imports or teardown needs: those start `python` itself (`PYTHON`).
"""

import atexit
import faulthandler
import importlib.util
import io
import logging
import os
import runpy
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path

import torch
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig

# A new interpreter's warning filters (Python's "Default Warning Filter"), in order.
_DEFAULT_FILTERS = [
    ("default", DeprecationWarning, "__main__"),
    ("ignore", DeprecationWarning, ""),
    ("ignore", PendingDeprecationWarning, ""),
    ("ignore", ImportWarning, ""),
    ("ignore", ResourceWarning, ""),
]


class Forked:
    """`script` run as `__main__` with `args` in a forked child: a file, or `-m <module>` as
    `python -m <module>` runs it. Its stdout (and stderr, unless `merge_stderr`) are read from
    files once it ends, or as it writes (`stdout.read()`)."""

    def __init__(
        self, script: Path | str, args: list[str], *, cwd: Path, env: dict[str, str] | None = None,
        module_dir: Path | None = None, merge_stderr: bool = False, ctrl_c: bool = False,
        new_session: bool = False,
    ) -> None:  # fmt: skip
        self.args = [str(script), *args]
        self.returncode: int | None = None
        out_fd, self.stdout = _output_file()
        err_fd, self.stderr = (out_fd, None) if merge_stderr else _output_file()
        self.pid = os.fork()
        if self.pid == 0:
            _child(self.args, cwd, env, module_dir, out_fd, err_fd, ctrl_c, new_session)
        os.close(out_fd)
        if not merge_stderr:
            os.close(err_fd)

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.05)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str | None]:
        self.wait(timeout)
        return self.stdout.read(), self.stderr.read() if self.stderr else None

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


def run_forked(
    script: Path | str, args: list[str], *, timeout: float, **options: object
) -> subprocess.CompletedProcess:
    """`subprocess.run(..., capture_output=True, text=True, timeout=...)` for a forked child."""
    process = Forked(script, args, **options)
    try:
        stdout, stderr = process.communicate(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def _output_file() -> tuple[int, io.TextIOWrapper]:
    """A file the child appends to and the test reads from the start, gone once both close."""
    fd, path = tempfile.mkstemp(prefix="forked-")
    os.close(fd)
    write = os.open(path, os.O_WRONLY | os.O_APPEND)
    read = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 - the caller's to close
    os.unlink(path)
    return write, read


def _child(
    argv: list[str], cwd: Path, env: dict[str, str] | None, module_dir: Path | None,
    out_fd: int, err_fd: int, ctrl_c: bool, new_session: bool,
) -> None:  # fmt: skip
    """Run `argv` as `python` would, then end the process: never returns into the test."""
    code: int = 1
    try:
        if new_session:
            os.setsid()
        os.chdir(cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        _new_streams(out_fd, err_fd)
        _new_interpreter_state(ctrl_c)
        module = argv[0].removeprefix("-m ") if argv[0].startswith("-m ") else None
        # `python -m` puts the working folder first on the path, and the module's file in argv.
        sys.argv[:] = [importlib.util.find_spec(module).origin, *argv[1:]] if module else argv
        first = os.getcwd() if module else str(Path(argv[0]).parent)
        sys.path[:0] = [first, *([str(module_dir)] if module_dir else [])]
        stems = [file.stem for file in module_dir.glob("*.py")] if module_dir else []
        for name in [module, *stems] if module else stems:
            sys.modules.pop(name, None)  # the module run afresh; another test's of the same name
        code = _main(argv[0], module)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def _main(script: str, module: str | None) -> int:
    """What `python script` (`python -m module`) does from running it to the end of its atexit
    handlers."""
    try:
        if module:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(script, run_name="__main__")
        code = 0
    except SystemExit as stop:
        code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
        if not isinstance(stop.code, int | None):
            print(stop.code, file=sys.stderr)
    except KeyboardInterrupt:
        traceback.print_exc()
        code = -signal.SIGINT
    except BaseException:
        traceback.print_exc()
        code = 1
    for thread in threading.enumerate():  # Python waits for non-daemon threads, then exits
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    # Python's exit: the atexit handlers, the script's alone (`_new_interpreter_state`), last
    # registered first. One that ends the process (train.py's) ends it here.
    for function, args, kwargs in reversed(_EXIT_HANDLERS):
        try:
            function(*args, **kwargs)
        except Exception:
            traceback.print_exc()
    sys.stdout.flush()
    sys.stderr.flush()
    if code == -signal.SIGINT:  # an uncaught Ctrl-C: Python ends by the signal itself
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code


def _new_streams(out_fd: int, err_fd: int) -> None:
    """stdin, stdout and stderr on the child's own descriptors, as `python` opens them; logging
    handlers that wrote to the test's streams (Lightning's, made at import) write to these."""
    old = {id(s): s for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}
    os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
    os.dup2(out_fd, 1)
    os.dup2(err_fd, 2)
    sys.stdin = sys.__stdin__ = open(0, closefd=False)  # noqa: SIM115
    sys.stdout = sys.__stdout__ = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
    sys.stderr = sys.__stderr__ = open(  # noqa: SIM115
        2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False
    )
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for handler in (h for lg in loggers for h in getattr(lg, "handlers", [])):
        if isinstance(handler, logging.StreamHandler) and id(handler.stream) in old:
            handler.setStream(sys.stderr)


def _new_interpreter_state(ctrl_c: bool) -> None:
    """Signal handlers, warnings, hooks, logging and atexit as in a new interpreter."""
    sigint_ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN and not ctrl_c
    for signum in signal.valid_signals():
        if callable(signal.getsignal(signum)):
            signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN if sigint_ignored else signal.default_int_handler)
    signal.set_wakeup_fd(-1)
    faulthandler.disable()
    warnings.resetwarnings()
    for action, category, module in _DEFAULT_FILTERS:
        warnings.filterwarnings(action, category=category, module=module, append=True)
    warnings.showwarning = _show_warning  # not pytest's recorder
    sys.excepthook, sys.unraisablehook = sys.__excepthook__, sys.__unraisablehook__
    threading.excepthook = threading.__excepthook__
    root = logging.getLogger()
    for handler in root.handlers[:]:  # pytest's capturing handlers
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    logging.disable(logging.NOTSET)
    GlobalHydra.instance().clear()
    HydraConfig.instance().cfg = None  # a test's run's settings: Lightning's launcher reads them
    # GNU OpenMP's threads do not survive a fork: a parallel region started in the child would
    # wait for them forever (pytorch/pytorch#41197). pytest's workers run one thread anyway.
    torch.set_num_threads(1)
    # The script's exit handlers are kept apart from the test process's (pytest's), which are
    # not the script's to run: `_main` runs them, as Python would at exit.
    atexit.register, atexit.unregister = _register_at_exit, _unregister_at_exit


_EXIT_HANDLERS: list[tuple] = []  # in a forked child: what its script registered with atexit


def _register_at_exit(function, *args, **kwargs):
    _EXIT_HANDLERS.append((function, args, kwargs))
    return function


def _unregister_at_exit(function) -> None:
    _EXIT_HANDLERS[:] = [handler for handler in _EXIT_HANDLERS if handler[0] != function]


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    (file or sys.stderr).write(warnings.formatwarning(message, category, filename, lineno, line))
