"""`python` for the tests' subprocesses, with torch, Lightning and kindling already imported.

A fresh `python train.py` spends about 10 s of CPU importing torch and Lightning before it reads
its first override, and the suite starts dozens of them. So each pytest process starts one
*zygote* (`start_zygote`): a process that imports what `train.py` imports, then forks one child
per command. Tests run `[*PYTHON, "train.py", *args]` (tests/conftest.py) as a subprocess,
exactly where they would run `[sys.executable, "train.py", *args]`. That subprocess is a small
client (this file, stdlib only): it hands its stdin, stdout, stderr and any other descriptor it
inherited, its working folder, environment and Ctrl-C disposition to the zygote, forwards the
signals it receives to the forked child, and exits as the child did (its status, or the same
signal). The child runs the command as `python` would: same `sys.argv`, `sys.path`,
environment, signal handlers, output, exit status and atexit handlers; what the zygote printed
while importing is printed again at its start.

In a child, `sys.executable` is the zygote's `python` (a script that runs this client), so the
processes a run starts with `sys.executable` (the other ranks of a DDP job, torchrun's workers)
start warm too; their rank variables are read again where Lightning read them at import.
Commands it cannot reproduce run in a fresh interpreter instead (the client execs `python`):
interpreter options (`-c`, `-X ...`), and environments that differ from the zygote's in a
variable read at import time (torch, CUDA, thread pools).
"""

import contextlib
import json
import os
import signal
import socket
import sys
from dataclasses import dataclass

# Variables that torch, Lightning or Python read while importing: a command whose environment
# differs from the zygote's in one of these runs in a fresh interpreter.
READ_AT_IMPORT = (
    "TORCH", "PYTORCH", "CUDA", "NCCL", "OMP_", "MKL", "KMP_", "LIGHTNING", "PL_", "TRITON",
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "MASTER_", "SLURM", "LD_",
    "PYTHON",
)  # fmt: skip
# ... except these, read when used (the ranks' variables: see `_run_as_python`).
READ_WHEN_USED = (
    "PYTHONPATH", "PYTHONUNBUFFERED", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
    "GROUP_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "PL_GLOBAL_SEED", "PL_SEED_WORKERS",
    "TORCHELASTIC_", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS",
)  # fmt: skip
# Variables the imports set whatever their value before (lightning.fabric's __init__): the
# pytest process that starts the zygote has imported Lightning too, so the zygote can't tell.
SET_AT_IMPORT = ("PYTORCH_NVML_BASED_CUDA_CHECK",)
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1)


def python_command(socket_path: str) -> list[str]:
    """The `python` of a test's command line: this client of the zygote at `socket_path`."""
    return [sys.executable, "-I", "-S", os.path.abspath(__file__), socket_path]


# ---------------------------------------------------------------------------------- client


def client(socket_path: str, argv: list[str]) -> None:
    fresh = [sys.executable, *argv]
    # The descriptors this process inherited (stdin, stdout, stderr, and any a launcher passed
    # on, as joblib's loky passes its workers a pipe): the child gets each at the same number.
    inherited = [fd for fd in map(int, os.listdir("/proc/self/fd")) if _is_open(fd)]
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.connect(socket_path)
    except OSError:  # no zygote (it failed, or the session ended): a fresh interpreter
        os.execv(sys.executable, fresh)
    child: list[int] = []
    pending: list[int] = []

    def forward(signum: int, frame: object) -> None:
        if child:
            os.kill(child[0], signum)
        else:
            pending.append(signum)

    ctrl_c_ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    for signum in FORWARDED:
        if not (signum == signal.SIGINT and ctrl_c_ignored):
            signal.signal(signum, forward)
    request = {
        "argv": argv,
        "cwd": os.getcwd(),
        "env": dict(os.environ),
        "ctrl_c": not ctrl_c_ignored,
        "fds": inherited,
    }
    body = json.dumps(request).encode()
    socket.send_fds(connection, [len(body).to_bytes(8, "big")], inherited)
    connection.sendall(body)
    replies = connection.makefile("r")
    first = replies.readline().split()
    if not first or first[0] == "fresh":
        os.execv(sys.executable, fresh)
    child.append(int(first[1]))
    for signum in pending:
        os.kill(child[0], signum)
    how, value = (replies.readline().split() or ["exit", "1"])[:2]
    if how == "signal":  # die as the child died
        signal.signal(int(value), signal.SIG_DFL)
        os.kill(os.getpid(), int(value))
    os._exit(int(value))


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:  # the folder listing's own descriptor, closed since
        return False
    return True


# ---------------------------------------------------------------------------------- zygote


def start_zygote(folder: str) -> tuple[str, "object"]:
    """Start a zygote listening in `folder`; return its socket path and its Popen."""
    import shlex
    import subprocess

    path = os.path.join(folder, "zygote.sock")
    python = os.path.join(folder, "python")  # the children's sys.executable
    with open(python, "w") as script:
        client = shlex.join(python_command(path))
        script.write(f'#!/bin/sh\nexec {client} "$@"\n')
    os.chmod(python, 0o755)
    log = open(os.path.join(folder, "zygote.log"), "wb")  # noqa: SIM115 (the zygote keeps it)
    process = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), "--serve", path],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    import time

    deadline = time.monotonic() + 60
    while not os.path.exists(path):  # it binds before importing: clients queue until ready
        if process.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the test zygote did not start; see {log.name}")
        time.sleep(0.01)
    return path, process


@dataclass
class Imports:
    """What importing kindling did to the zygote, which each child's fresh process would do."""

    env_before: dict[str, str]  # the environment before
    env_set: dict[str, str]  # the variables the imports set
    sys_path: list[str]  # sys.path less the script's folder and PYTHONPATH
    printed: bytes  # their output (warnings)
    child_python: str  # the children's sys.executable: the script that runs the client


def serve(path: str) -> None:
    import selectors

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path + ".tmp")
    listener.listen(64)
    os.rename(path + ".tmp", path)
    parent = os.getppid()
    env_before = dict(os.environ)
    imported_from = os.environ.get("PYTHONPATH", "").split(os.pathsep)

    from kindling.garbage_collection import long_lived_imports

    with long_lived_imports():  # as train.py imports
        import hydra  # noqa: F401  (what train.py imports)
        import omegaconf  # noqa: F401

        import kindling.train  # noqa: F401

    sys.stderr.flush()
    with open(f"/proc/{os.getpid()}/fd/2", "rb") as log:  # what the imports printed
        printed = log.read()
    imports = Imports(
        env_before=env_before,
        env_set={
            k: v for k, v in os.environ.items() if env_before.get(k) != v or k in SET_AT_IMPORT
        },
        sys_path=[p for p in sys.path[1:] if p not in imported_from],
        printed=printed,
        child_python=os.path.join(os.path.dirname(path), "python"),  # written by start_zygote
    )

    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    clients: dict[int, socket.socket] = {}  # child pid -> its client's connection
    while True:
        for key, _ in selector.select(timeout=0.05):
            if key.fileobj is listener:
                connection, _ = listener.accept()
                pid = _start(connection, listener, clients, imports)
                if pid is not None:
                    clients[pid] = connection
                    selector.register(connection, selectors.EVENT_READ, pid)
            elif not key.fileobj.recv(1):  # the client died (SIGKILL): so does its child
                selector.unregister(key.fileobj)
                _kill(key.data)
        while clients:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            connection = clients.pop(pid, None)
            if connection is None:
                continue
            if os.WIFSIGNALED(status):
                reply = f"signal {os.WTERMSIG(status)}\n"
            else:
                reply = f"exit {os.WEXITSTATUS(status)}\n"
            try:
                connection.sendall(reply.encode())
                selector.unregister(connection)
            except (OSError, KeyError):  # the client died first
                pass
            connection.close()
        if os.getppid() != parent:  # the pytest process is gone
            for pid in clients:
                _kill(pid)
            os._exit(0)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _receive(connection: socket.socket) -> tuple[dict, list[int]]:
    head, fds, _, _ = socket.recv_fds(connection, 8, 250)
    size = int.from_bytes(head, "big")
    body = b""
    while len(body) < size:
        body += connection.recv(size - len(body))
    return json.loads(body), fds


def _warmable(request: dict, imports: "Imports") -> bool:
    argv = _without_unbuffered(request["argv"])
    if (
        not argv
        or (argv[0].startswith("-") and argv[0] != "-m")
        or (argv[0] == "-m" and len(argv) < 2)
    ):
        return False
    env = request["env"]
    return not any(
        key.startswith(READ_AT_IMPORT)
        and not key.startswith(READ_WHEN_USED)
        and key not in imports.env_set  # the child's imports set them anew
        and env.get(key) != imports.env_before.get(key)
        for key in set(env) | set(imports.env_before)
    )


def _without_unbuffered(argv: list[str]) -> list[str]:
    """`python -u ...` (torchrun starts its workers so): the option is applied by the child."""
    return argv[1:] if argv[:1] == ["-u"] else argv


def _unbuffered_output() -> None:
    import io

    for fd, name in ((1, "stdout"), (2, "stderr")):
        stream = getattr(sys, name)
        unbuffered = open(fd, "wb", buffering=0, closefd=False)  # noqa: SIM115
        setattr(sys, name, io.TextIOWrapper(
            unbuffered, encoding=stream.encoding, errors=stream.errors, write_through=True
        ))  # fmt: skip


def _start(connection, listener, clients, imports: "Imports") -> int | None:
    request, fds = _receive(connection)
    if not _warmable(request, imports):
        connection.sendall(b"fresh\n")
        connection.close()
        for fd in fds:
            os.close(fd)
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        listener.close()
        for other in clients.values():
            other.close()
        connection.close()
        _run_as_python(request, fds, imports)  # never returns
    for fd in fds:
        os.close(fd)
    connection.sendall(f"pid {pid}\n".encode())
    return pid


def _run_as_python(request: dict, fds: list[int], imports: "Imports") -> None:
    import atexit
    import fcntl
    import importlib
    import runpy
    import threading
    import traceback

    # Each inherited descriptor at its number (first out of the way of those numbers), open
    # across exec as it was in the client.
    moved = [fcntl.fcntl(fd, fcntl.F_DUPFD, 1024) for fd in fds]
    for fd in fds:
        os.close(fd)
    for number, fd in zip(request["fds"], moved, strict=True):
        os.dup2(fd, number)
        os.close(fd)
    signal.signal(
        signal.SIGINT, signal.default_int_handler if request["ctrl_c"] else signal.SIG_IGN
    )
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update(imports.env_set)  # as the imports of a fresh process would
    # Lightning read the process's rank at import; a rank started warm has its own.
    from lightning.fabric.utilities.rank_zero import _get_rank, rank_zero_only

    rank_zero_only.rank = _get_rank() or 0
    if "OMP_NUM_THREADS" in os.environ:
        import torch

        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    sys.executable = imports.child_python
    argv = _without_unbuffered(request["argv"])
    if argv != request["argv"] or os.environ.get("PYTHONUNBUFFERED"):
        _unbuffered_output()
    module = argv[1] if argv[0] == "-m" else None
    first = os.getcwd() if module else os.path.dirname(os.path.abspath(argv[0]))
    extra = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *imports.sys_path]
    importlib.invalidate_caches()
    if "numpy" in sys.modules:  # a fresh process seeds numpy's global generator anew
        sys.modules["numpy"].random.seed()
    os.write(2, imports.printed)

    status = 0
    interrupted = False
    try:
        if module:
            sys.argv = [module, *argv[2:]]
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.argv = list(argv)
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as stop:
        if stop.code is None:
            status = 0
        elif isinstance(stop.code, int):
            status = stop.code
        else:
            print(stop.code, file=sys.stderr)
            status = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        status = 1
    threading._shutdown()  # as the interpreter does at exit: wait for non-daemon threads
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    if interrupted:  # Python re-raises an unhandled Ctrl-C as the signal itself
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(status & 0xFF)


if __name__ == "__main__":
    if sys.argv[1] == "--serve":
        serve(sys.argv[2])
    else:
        client(sys.argv[1], sys.argv[2:])
