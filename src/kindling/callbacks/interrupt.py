"""Save a resumable checkpoint when a run is stopped by SIGTERM (clusters) or Ctrl-C, and
requeue a SLURM job that SLURM warns with SIGUSR1 (time limit, preemption)."""

import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException


class CheckpointOnInterrupt(Callback):
    """On SIGTERM or Ctrl-C during fit, write `last.ckpt` at the end of the current step.

    The signal only raises a flag. Every rank then decides together, at the end of each step
    (and of each epoch and validation), whether any of them was signalled; if one was, all stop
    there and save together. Lightning's handler broadcasts from inside the signal handler
    (since Lightning-AI/pytorch-lightning#20825, for #20806), which can land in the middle of
    another collective and leave the ranks waiting on each other for ever; kindling's takes its
    place while a stage runs. A signal to the launching process is passed on to its ranks.

    While training runs, the first Ctrl-C is handled as SIGTERM, so it never lands inside
    `optimizer.step` and the checkpoint never holds half a step; a second Ctrl-C stops at once,
    without a checkpoint. The checkpoint holds the loop state, so `ckpt_path=<it>` resumes
    mid-epoch. The run exits with 128 + the signal's number (130 for Ctrl-C, 143 for SIGTERM);
    `saved_path` tells the caller where the checkpoint went. Outside fit (test, validate) the
    run stops after the current batch, with no checkpoint.

    A signal that arrives during the validation of a fit waits until that validation ends (it is
    short next to training): a run resumed from the middle of it would never validate that epoch.

    In a SLURM job, SIGUSR1 (`--signal=USR1@<seconds>` before the time limit, or `scancel
    --signal=USR1`) stops the run the same way, then rank 0 requeues the job. The checkpoint of
    a SLURM job is `<run folder>/hpc_ckpt_<n>.ckpt` (also on SIGTERM: `scontrol requeue`), which
    Lightning resumes from when SLURM starts the job again in the same folder. It replaces
    Lightning's own SIGUSR1 handler, which saves in the middle of whatever step the signal lands
    in.

    `exit_within_s`: a rank that, once signalled, goes that long without ending a step (another
    rank never reached the step's end: a stuck loader, a dead peer) prints why and exits with
    128 + the signal, taking the ranks it started with it, instead of waiting for ever.
    """

    def __init__(self, filename: str = "last.ckpt", exit_within_s: float = 300.0):
        self.filename = filename
        self.exit_within_s = exit_within_s
        self.saved_path: str | None = None
        self.stopped_by: signal.Signals | None = None
        self._trainer: L.Trainer | None = None  # set while this callback's handlers are in place
        self._before: dict[signal.Signals, Any] = {}  # Ctrl-C's and SIGUSR1's handlers, replaced
        self._deadline: float | None = None  # of the watchdog, once a signal came
        self._held = False  # a stop held until the validation it came in ends

    # -- the handlers: they only raise the flag --------------------------------------------

    def _install(self, trainer: L.Trainer) -> None:
        """Take SIGTERM and Ctrl-C over from Lightning's handler (in place by the stage hooks,
        and only on platforms that have one), and SIGUSR1 in a SLURM job. A Ctrl-C that was
        ignored (a background job) stays ignored."""
        current = signal.getsignal(signal.SIGTERM)
        if current == self._on_signal or threading.current_thread() is not threading.main_thread():
            return
        if current in (signal.SIG_DFL, None):
            return
        self._trainer, self.stopped_by, self._held = trainer, None, False
        signal.signal(signal.SIGTERM, self._on_signal)
        if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
            self._before[signal.SIGINT] = signal.signal(signal.SIGINT, self._on_signal)
        if SLURMEnvironment.detect():
            self._before[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._on_signal)
        # Lightning puts back its SIGTERM handler's predecessor when the stage ends.

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGINT:
            self._restore(signal.SIGINT)  # a second Ctrl-C raises KeyboardInterrupt at once
            rank_zero_info("Ctrl-C: stopping at the end of this step (Ctrl-C again stops at once).")
        elif signum == signal.SIGUSR1:
            rank_zero_info(
                "SIGUSR1 from SLURM: checkpointing at the end of this step, then requeueing."
            )
        if self.stopped_by is not None:
            return
        self.stopped_by = signal.Signals(signum)
        self._forward(signal.SIGTERM)
        self._deadline = time.monotonic() + self.exit_within_s
        threading.Thread(target=self._watchdog, name="exit-watchdog", daemon=True).start()

    def _forward(self, signum: int) -> None:
        """Send `signum` to the ranks this process started (Lightning's launcher, if any)."""
        launcher = self._trainer.strategy.launcher if self._trainer else None
        if launcher is not None:
            launcher.kill(signum)

    def _watchdog(self) -> None:
        while True:
            deadline = self._deadline
            if deadline is None:  # the stage ended as it should: stand down
                return
            left = deadline - time.monotonic()
            if left <= 0:
                break
            time.sleep(min(left, 1.0))
        rank = self._trainer.global_rank if self._trainer else 0
        print(
            f"Rank {rank} did not stop within {self.exit_within_s:g} s of {self.stopped_by.name}: "
            "another rank never reached the end of its step. Exiting without saving; "
            "the last checkpoint written is where a resume starts.",
            file=sys.stderr, flush=True,
        )  # fmt: skip
        self._forward(signal.SIGKILL)
        os._exit(128 + self.stopped_by)

    def _restore(self, *signums: signal.Signals) -> None:
        """Put back the handlers of `signums` (all this callback replaced, by default)."""
        for signum in signums or list(self._before):
            if signum in self._before:
                signal.signal(signum, self._before.pop(signum))

    # -- where the ranks decide together ----------------------------------------------------

    def _agree(self, trainer: L.Trainer) -> None:
        """At a moment every rank reaches together: stop them all if any was signalled."""
        if self._trainer is None:
            return
        if self._deadline is not None:
            self._deadline = time.monotonic() + self.exit_within_s  # this rank is moving
        if trainer.strategy.reduce_boolean_decision(self.stopped_by is not None, all=False):
            from kindling.internals import set_sigterm_received  # a private part of Lightning

            set_sigterm_received(trainer, True)

    def on_sanity_check_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._install(trainer)

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._install(trainer)

    def on_validation_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._install(trainer)

    def on_test_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._install(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._deadline = None  # the stage ended; the process may go on (a multirun's next job)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._agree(trainer)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._agree(trainer)

    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            self._agree(trainer)
        elif trainer.received_sigterm:
            # Lightning stops after this hook when the flag is up; hold it down until the end.
            from kindling.internals import set_sigterm_received  # a private part of Lightning

            set_sigterm_received(trainer, False)
            self._held = True

    def on_test_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._agree(trainer)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._held:
            from kindling.internals import set_sigterm_received  # a private part of Lightning

            set_sigterm_received(trainer, True)
            self._held = False
        elif trainer.state.fn == TrainerFn.FITTING:
            self._agree(trainer)

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore()
        # A KeyboardInterrupt here is a second Ctrl-C, or one outside training: it may have
        # landed anywhere, in the middle of an optimizer step too, so nothing is saved.
        if not isinstance(exception, SIGTERMException):
            self._deadline = None  # the exception ends the run
            return
        # The exit status `kindling.train.run` gives the run: 130 for Ctrl-C, 143 for SIGTERM.
        exception.code = 128 + (self.stopped_by or signal.SIGTERM)
        # Also during the validation inside fit: Lightning stops there too on SIGTERM.
        if trainer.state.fn != TrainerFn.FITTING:
            self._deadline = None
            return
        self._deadline = time.monotonic() + self.exit_within_s  # every rank saves together
        if SLURMEnvironment.detect():
            # Where a requeued job resumes from: the newest hpc_ckpt of its folder. SIGUSR1 asks
            # kindling to requeue; SIGTERM comes from SLURM itself (`scontrol requeue`, which
            # requeues, or `scancel`, which does not).
            self.saved_path = next_hpc_checkpoint(trainer.default_root_dir)
            trainer.save_checkpoint(self.saved_path)
            self._deadline = None
            if self.stopped_by == signal.SIGUSR1 and trainer.is_global_zero:
                requeue(self.saved_path)
            return
        checkpoint_dir = getattr(trainer.checkpoint_callback, "dirpath", None)
        folder = str(checkpoint_dir or Path(trainer.default_root_dir) / "checkpoints")
        # Joined as text: Path would turn the `//` of an s3:// or memory:// folder into `/`.
        self.saved_path = f"{folder.rstrip('/')}/{self.filename}"
        trainer.save_checkpoint(self.saved_path)
        self._deadline = None  # saved: the run ends as it should
        rank_zero_info(
            f"Interrupted at epoch {trainer.current_epoch}, step {trainer.global_step}. "
            f"Checkpoint: {self.saved_path}\n"
            # Quoted for the shell where it must be; the checkpoint brings the run's overrides.
            f"Resume with: python train.py {shlex.quote(f'ckpt_path={self.saved_path}')}"
        )


def next_hpc_checkpoint(run_dir: str | Path) -> str:
    """`<run_dir>/hpc_ckpt_<n>.ckpt`, n above any there: Lightning resumes a SLURM job from the
    highest when it starts with no `ckpt_path`."""
    taken = [int(p.stem.rpartition("_")[2]) for p in Path(run_dir).glob("hpc_ckpt_*.ckpt")]
    return str(Path(run_dir) / f"hpc_ckpt_{max(taken, default=0) + 1}.ckpt")


def requeue(checkpoint: str) -> None:
    """Put this SLURM job (or array task) back in the queue: SLURM stops it and starts it again."""
    job = os.environ["SLURM_JOB_ID"]
    if "SLURM_ARRAY_JOB_ID" in os.environ:
        job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    done = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
    if done.returncode == 0:
        rank_zero_info(f"Requeued SLURM job {job}: it resumes from {checkpoint}.")
    else:
        rank_zero_warn(
            f"Could not requeue SLURM job {job} ({done.stderr.strip()}). Resume it with: "
            f"python train.py ckpt_path={checkpoint}"
        )
