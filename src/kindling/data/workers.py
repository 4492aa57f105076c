"""A data loader's worker processes: how many by default, what they need (to leave stop signals
to the main process, to be ended when it exits); imported where a loader has workers."""

import atexit
import multiprocessing
import os
import platform
import signal
import sys

from lightning.fabric.utilities.seed import pl_worker_init_function
from lightning.pytorch.utilities import rank_zero_warn

# CPython before 3.11.10 (and 3.12.0) can leave a forked child stuck in os.fork() when a thread
# enters Python at that moment, as torch.distributed's gloo thread does after each collective:
# python/cpython#112275. Seen here once in about a thousand worker starts of two-process runs.
FORK_CAN_HANG = sys.version_info < (3, 11, 10) or sys.version_info[:3] == (3, 12, 0)


def default_num_workers(processes_per_node: int) -> int:
    """The CPUs this process may run on (taskset, cgroups, SLURM), shared by this machine's
    processes."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        cpus = os.cpu_count() or 1
    return max(1, cpus // max(1, processes_per_node))


def warn_if_workers_can_hang() -> None:
    """Where loader workers are forked beside the threads of a multi-process run."""
    if FORK_CAN_HANG:
        rank_zero_warn(
            f"Python {platform.python_version()} can leave a loader worker stuck as it starts "
            "in a multi-process run (python/cpython#112275): the run then hangs. Use Python "
            "3.11.10 or later (3.12.1 or later), or data.num_workers=0."
        )


def leave_stop_signals_to_the_main_process(worker_id: int, rank: int) -> None:
    """A loader worker ignores Ctrl-C and SIGTERM: a terminal and SLURM's `scancel` signal the
    whole process group, and a worker that died of it would fail the step its main process is
    finishing before it saves. The main process ends its workers when it exits."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if int(os.environ.get("PL_SEED_WORKERS", 0)):  # Lightning seeds only a loader without one
        pl_worker_init_function(worker_id, rank)


@atexit.register  # after multiprocessing's own exit hook (torch imported it), so it runs first
def _kill_loader_workers_at_exit() -> None:
    """Python's exit terminates daemonic children (loader workers) with SIGTERM, then waits for
    them: workers that ignore it would keep a process that iterated a loader itself from ever
    exiting. At exit they are killed instead (without torch's check of its workers, which would
    report the kill as a failure); a Trainer has ended its own by then."""
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for child in multiprocessing.active_children():
        if child.daemon:
            child.kill()
