"""Save a resumable checkpoint when a run is stopped by SIGTERM (clusters) or Ctrl-C, and
requeue a SLURM job that SLURM warns with SIGUSR1 (time limit, preemption)."""

import os
import signal
import subprocess
import threading
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

    Lightning stops at the end of the current step on SIGTERM (all ranks together) and calls
    `on_exception`. While training runs, Ctrl-C is handled the same way: the first one is passed
    on as SIGTERM, so it never lands inside `optimizer.step` and the checkpoint never holds half a
    step; a second Ctrl-C stops at once, without a checkpoint. The checkpoint holds the loop
    state, so `ckpt_path=<it>` resumes mid-epoch. The run exits with 128 + the signal's number
    (130 for Ctrl-C, 143 for SIGTERM); `saved_path` tells the caller where the checkpoint went.

    A signal that arrives during the validation of a fit waits until that validation ends (it is
    short next to training): Lightning would stop in the middle of it, and a run resumed from
    there never validates that epoch. So every epoch is validated exactly once, and the run
    stops at the end of its epoch (or, for validation within an epoch, at the next step).

    In a SLURM job, SIGUSR1 (`--signal=USR1@<seconds>` before the time limit, or `scancel
    --signal=USR1`) stops the run the same way, then rank 0 requeues the job. The checkpoint is
    `<run folder>/hpc_ckpt_<n>.ckpt`, which Lightning resumes from when SLURM starts the job
    again in the same folder. It replaces Lightning's own SIGUSR1 handler, which saves in the
    middle of whatever step the signal lands in.
    """

    def __init__(self, filename: str = "last.ckpt"):
        self.filename = filename
        self.saved_path: str | None = None
        self.stopped_by: signal.Signals | None = None
        self._before: dict[signal.Signals, Any] = {}  # the handlers this callback replaced
        self._held = False  # a SIGTERM held until the validation it came in ends

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning's SIGTERM handler is in place by now (and only on platforms that have one).
        # A Ctrl-C that was ignored (a background job) stays ignored.
        lightning_handles_sigterm = signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
        main_thread = threading.current_thread() is threading.main_thread()
        if not (lightning_handles_sigterm and main_thread):
            return
        self.stopped_by = None
        if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
            self._before[signal.SIGINT] = signal.signal(signal.SIGINT, self._stop_at_step_end)
        if SLURMEnvironment.detect():
            self._before[signal.SIGUSR1] = signal.signal(signal.SIGUSR1, self._stop_at_step_end)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._restore()

    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        # Lightning stops after this hook when the flag is up; hold it down until the end.
        if trainer.state.fn == TrainerFn.FITTING and trainer.received_sigterm:
            from kindling.internals import set_sigterm_received  # a private part of Lightning

            set_sigterm_received(trainer, False)
            self._held = True

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self._held:
            from kindling.internals import set_sigterm_received  # a private part of Lightning

            set_sigterm_received(trainer, True)
            self._held = False

    def _stop_at_step_end(self, signum: int, frame: FrameType | None) -> None:
        self.stopped_by = signal.Signals(signum)
        if signum == signal.SIGINT:
            self._restore(signal.SIGINT)  # a second Ctrl-C raises KeyboardInterrupt at once
            rank_zero_info("Ctrl-C: stopping at the end of this step (Ctrl-C again stops at once).")
        else:
            rank_zero_info(
                "SIGUSR1 from SLURM: checkpointing at the end of this step, then requeueing."
            )
        os.kill(os.getpid(), signal.SIGTERM)

    def _restore(self, *signums: signal.Signals) -> None:
        for signum in signums or list(self._before):
            if signum in self._before:
                signal.signal(signum, self._before.pop(signum))

    def on_exception(
        self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException
    ) -> None:
        self._restore()
        # A KeyboardInterrupt here is a second Ctrl-C, or one outside training: it may have
        # landed anywhere, in the middle of an optimizer step too, so nothing is saved.
        if not isinstance(exception, SIGTERMException):
            return
        # The exit status `kindling.train.run` gives the run: 130 for Ctrl-C, 143 for SIGTERM.
        exception.code = 128 + (self.stopped_by or signal.SIGTERM)
        # Also during the validation inside fit: Lightning stops there too on SIGTERM.
        if trainer.state.fn != TrainerFn.FITTING:
            return
        if self.stopped_by == signal.SIGUSR1:
            self.saved_path = next_hpc_checkpoint(trainer.default_root_dir)
            trainer.save_checkpoint(self.saved_path)
            if trainer.is_global_zero:
                requeue(self.saved_path)
            return
        checkpoint_dir = getattr(trainer.checkpoint_callback, "dirpath", None)
        folder = str(checkpoint_dir or Path(trainer.default_root_dir) / "checkpoints")
        # Joined as text: Path would turn the `//` of an s3:// or memory:// folder into `/`.
        self.saved_path = f"{folder.rstrip('/')}/{self.filename}"
        trainer.save_checkpoint(self.saved_path)
        rank_zero_info(
            f"Interrupted at epoch {trainer.current_epoch}, step {trainer.global_step}. "
            f"Checkpoint: {self.saved_path}\n"
            f"Resume with: python train.py ckpt_path={self.saved_path}"
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
