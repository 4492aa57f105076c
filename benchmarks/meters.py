"""What the benchmarks measure a stretch of work with: wall-clock seconds, or instructions.

Seconds are what users wait for, but on a shared machine they drift by several percent from one
minute to the next. Instructions executed, counted by valgrind's callgrind, hardly move with
whatever else the machine is doing (the same work counts the same to a few tenths of a
percent): a measure that does not drift, for telling apart costs smaller than the clock's drift.
They are a proxy for time (an instruction of a vectorised kernel does more work than one of the
Python interpreter), so the two are reported side by side, never mixed.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

UNDER_CALLGRIND = "KINDLING_UNDER_CALLGRIND"  # set when this process runs under callgrind

# callgrind's client requests are C macros; a two-function library makes them callable.
_CLIENT_REQUESTS = r"""
#include <valgrind/callgrind.h>
void meter_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void meter_stop(void) { CALLGRIND_DUMP_STATS; CALLGRIND_STOP_INSTRUMENTATION; }
"""


class WallClock:
    """Seconds, with the device's queued work finished before each clock read."""

    unit = "s"

    def __init__(self, device=None) -> None:
        self.device = device  # a torch.device; None or a CPU needs no synchronising
        self._start = 0.0

    def _sync(self) -> None:
        if self.device is not None and self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)

    def start(self) -> None:
        self._sync()
        self._start = time.perf_counter()

    def stop(self) -> float:
        self._sync()
        return time.perf_counter() - self._start


class InstructionCounter:
    """Instructions executed between `start` and `stop`, in this process (CPU only).

    Works only in a process started by `exec_under_callgrind`, which counts nothing outside
    these brackets.
    """

    unit = "instructions"

    def __init__(self) -> None:
        import ctypes

        self._requests = ctypes.CDLL(os.environ[UNDER_CALLGRIND])
        self._dumps = Path(os.environ["KINDLING_CALLGRIND_OUT"])

    def start(self) -> None:
        self._requests.meter_start()

    def stop(self) -> float:
        self._requests.meter_stop()
        # Each stop dumps to callgrind.out.<n>, read and removed here: there is one at a time.
        (dump,) = self._dumps.parent.glob(self._dumps.name + ".*")
        for line in dump.read_text().splitlines():
            if line.startswith("summary:"):
                dump.unlink()
                return float(line.split()[1])
        raise RuntimeError(f"{dump} has no summary line")


def under_callgrind() -> bool:
    return UNDER_CALLGRIND in os.environ


def exec_under_callgrind(argv: list[str]) -> None:
    """Start this script again under callgrind, in place of this process."""
    valgrind, compiler = shutil.which("valgrind"), shutil.which("cc") or shutil.which("gcc")
    if valgrind is None or compiler is None:
        sys.exit(
            "Counting instructions needs valgrind and a C compiler (apt install valgrind gcc)."
        )
    folder = Path(tempfile.mkdtemp(prefix="kindling-callgrind-"))
    (folder / "requests.c").write_text(_CLIENT_REQUESTS)
    library = folder / "librequests.so"
    build = [compiler, "-O2", "-shared", "-fPIC", "-o", str(library), str(folder / "requests.c")]
    if subprocess.run(build, capture_output=True).returncode != 0:
        sys.exit("Could not build callgrind's client requests: is valgrind's callgrind.h there?")
    out = folder / "callgrind.out"
    env = {
        **os.environ,
        UNDER_CALLGRIND: str(library),
        "KINDLING_CALLGRIND_OUT": str(out),
        # One thread: OpenMP threads spin while they wait, a count that depends on scheduling.
        "OMP_NUM_THREADS": "1",
        "PYTHONHASHSEED": "0",
    }
    command = [
        valgrind, "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
        "--quiet", sys.executable, *argv,
    ]  # fmt: skip
    os.execve(valgrind, command, env)


def make_meter(measure: str, device=None) -> WallClock | InstructionCounter:
    """The meter `--measure` names ("time" or "instructions"). For instructions this first starts
    the running script again under callgrind, on the CPU with one thread."""
    if measure == "time":
        return WallClock(device)
    if not under_callgrind():
        exec_under_callgrind(sys.argv)  # does not return
    import torch

    torch.set_num_threads(1)
    return InstructionCounter()


# How per-step figures are shown: meter unit -> (factor, unit shown).
PER_STEP = {"s": (1e3, "ms"), "instructions": (1e-6, "M instructions")}
