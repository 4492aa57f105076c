"""A resumable checkpoint when SIGTERM (clusters), Ctrl-C or SLURM's SIGUSR1 stops a run."""

import os
import shlex
import signal
import sys
import threading
import time
from typing import Any

import lightning as L
import torch
import torch.distributed as dist
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.environments import SLURMEnvironment
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities import rank_zero_info
from lightning.pytorch.utilities.exceptions import SIGTERMException

from kindling.internals import set_sigterm_received  # a private part of Lightning


def finished(trainer: L.Trainer) -> bool:
    """Whether the fit has trained its whole length (`max_epochs` or `max_steps`)."""
    epochs, steps = trainer.max_epochs, trainer.max_steps
    return (epochs not in (None, -1) and trainer.current_epoch >= epochs) or (
        steps not in (None, -1) and trainer.global_step >= steps
    )


class RankVote:
    """Whether any rank raised its flag, voted over a CPU (gloo) group of the ranks' own, so that
    no vote waits for the device or joins the training's collectives. `late` hands in this
    step's flag and returns the previous step's result: its all-reduce ran in the background
    during the step, so no step waits for the others' hooks. `now` blocks: for the moments every
    rank reaches together anyway (an epoch's end, validation's end)."""

    def __init__(self) -> None:
        self.group = dist.new_group(backend="gloo")  # every rank calls it, in the same order
        self._pending: tuple[torch.Tensor, dist.Work] | None = None

    def _start(self, flag: bool) -> tuple[torch.Tensor, dist.Work]:
        votes = torch.tensor([int(flag)])
        return votes, dist.all_reduce(votes, dist.ReduceOp.MAX, group=self.group, async_op=True)

    def _result(self) -> bool:
        if self._pending is None:
            return False
        (votes, work), self._pending = self._pending, None
        work.wait()
        return bool(votes.item())

    def late(self, flag: bool) -> bool:
        agreed = self._result()
        if not agreed:  # every rank stops at this step's end: no further vote
            self._pending = self._start(flag)
        return agreed

    def now(self, flag: bool) -> bool:
        self._result()  # flags only ever rise: this vote's result includes the pending one's
        votes, work = self._start(flag)
        work.wait()
        return bool(votes.item())

    def close(self) -> None:
        self._pending = None  # every rank started it, so it completes without anyone waiting
        dist.destroy_process_group(self.group)


class CheckpointOnInterrupt(Callback):
    """On SIGTERM, Ctrl-C (or SIGUSR1 in a SLURM job) during fit, write `filename` at the end of
    the step (SLURM: `hpc_ckpt_<n>.ckpt`, and SIGUSR1 requeues); the run exits with 128 + the
    signal. The signal only raises a flag (Lightning's handler broadcasts inside the handler,
    which can deadlock the ranks). With several processes the ranks vote on it without blocking
    (`RankVote`): a rank signalled during step n stops, with every other, at the end of step n + 1
    at the latest. A second Ctrl-C stops at once; a signal in fit's validation waits for its end;
    a rank that goes `exit_within_s` without ending a step once signalled (a dead peer) exits."""

    def __init__(self, filename: str = "last.ckpt", exit_within_s: float = 300.0):
        self.filename = filename
        self.exit_within_s = exit_within_s
        self.stopped_by: signal.Signals | None = None
        self._trainer: L.Trainer | None = None  # set once the handlers are in place
        self._ctrl_c_before: Any = None  # Ctrl-C's handler, put back at the first Ctrl-C
        self._deadline: float | None = None  # of the watchdog, once a signal came
        self._vote: RankVote | None = None  # with several processes

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if trainer.world_size > 1 and dist.is_initialized():
            self._vote = RankVote()

    # Lightning's handler is in place while a stage runs: taken over, with Ctrl-C unless ignored
    # and SIGUSR1 in a SLURM job. Lightning puts back every handler when the stage ends.
    def on_sanity_check_start(self, trainer: L.Trainer, *args: Any) -> None:
        current = signal.getsignal(signal.SIGTERM)
        if current in (self._on_signal, signal.SIG_DFL, None):
            return
        if threading.current_thread() is not threading.main_thread():
            return
        self._trainer, self.stopped_by = trainer, None
        signal.signal(signal.SIGTERM, self._on_signal)
        if signal.getsignal(signal.SIGINT) != signal.SIG_IGN:
            self._ctrl_c_before = signal.signal(signal.SIGINT, self._on_signal)
        if SLURMEnvironment.detect():
            signal.signal(signal.SIGUSR1, self._on_signal)

    on_train_start = on_validation_start = on_test_start = on_sanity_check_start

    def _on_signal(self, signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            signal.signal(signal.SIGINT, self._ctrl_c_before)  # a second one raises at once
            rank_zero_info("Ctrl-C: stopping at the end of this step (Ctrl-C again stops at once).")
        elif signum == signal.SIGUSR1:
            rank_zero_info("SIGUSR1 from SLURM: checkpointing at this step's end, then requeueing.")
        if self.stopped_by is None:
            self.stopped_by = signal.Signals(signum)
            self._forward(signal.SIGTERM)
            self._deadline = time.monotonic() + self.exit_within_s
            threading.Thread(target=self._watchdog, daemon=True).start()

    def _forward(self, signum: int) -> None:
        """To the ranks Lightning's launcher started from this process, if any."""
        if (launcher := self._trainer.strategy.launcher) is not None:
            launcher.kill(signum)

    def _watchdog(self) -> None:
        while (deadline := self._deadline) is not None:  # None: the stage ended as it should
            if time.monotonic() >= deadline:
                rank, name = self._trainer.global_rank, self.stopped_by.name
                print(
                    f"Rank {rank} did not stop within {self.exit_within_s:g} s of {name}: another "
                    "rank never reached the end of its step. Exiting without saving; the last "
                    "checkpoint written is where a resume starts.",
                    file=sys.stderr, flush=True,
                )  # fmt: skip
                self._forward(signal.SIGKILL)
                os._exit(128 + self.stopped_by)
                return  # where os._exit is replaced (tests)
            time.sleep(min(max(deadline - time.monotonic(), 0), 1.0))

    def _agree(self, trainer: L.Trainer, *args: Any, late: bool = False) -> None:
        """At a moment every rank reaches together: stop them all if any was signalled (`late`:
        if any was by the previous such moment)."""
        if self._trainer is None:
            return
        if self._deadline is not None:
            self._deadline = time.monotonic() + self.exit_within_s  # this rank is moving
        signalled = self.stopped_by is not None
        if self._vote is not None:
            signalled = (self._vote.late if late else self._vote.now)(signalled)
        if signalled:
            set_sigterm_received(trainer, True)

    def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        self._agree(trainer, late=True)

    on_test_batch_end = on_train_batch_end
    on_train_epoch_end = _agree

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._deadline = None  # the stage ended; the process may go on (a multirun's next job)
        if self._vote is not None:
            self._vote.close()
            self._vote = None

    # In fit, the ranks agree at the validation's end: a stop agreed before it is held till then
    # (Lightning would stop after this hook), and agreed again, as its signal is still there.
    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
        if trainer.state.fn != TrainerFn.FITTING:
            self._agree(trainer, late=True)
        elif self._trainer is not None:
            set_sigterm_received(trainer, False)

    def on_validation_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if trainer.state.fn == TrainerFn.FITTING:
            self._agree(trainer)

    def _last_checkpoint(self, trainer: L.Trainer) -> str:
        folder = getattr(trainer.checkpoint_callback, "dirpath", None)
        folder = folder or os.path.join(trainer.default_root_dir, "checkpoints")
        return os.path.join(folder, self.filename)  # Path would turn s3:// into s3:/

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        """A signal agreed as the last epoch ended: the training ended all the same, and is saved
        here (`kindling.train` then stops before testing, with 128 + the signal)."""
        if self._trainer is None or self.stopped_by is None or not trainer.received_sigterm:
            return
        path = self._last_checkpoint(trainer)
        trainer.save_checkpoint(path)
        self._deadline = None
        self._say_complete(trainer, path)

    def _say_complete(self, trainer: L.Trainer, path: str) -> None:
        name = "Ctrl-C" if self.stopped_by == signal.SIGINT else self.stopped_by.name
        rank_zero_info(
            f"Stopped by {name} as training ended: it is complete (checkpoint: {path}), and the "
            f"test was not run. Test it with: python train.py train=false "
            f"{shlex.quote(f'ckpt_path={path}')}"
        )

    def on_exception(self, trainer: L.Trainer, pl_module: Any, exception: BaseException) -> None:
        # Anything else (a second Ctrl-C, an error) may have landed mid-step: nothing is saved.
        if not isinstance(exception, SIGTERMException):
            self._deadline = None
            return
        exception.code = 128 + (self.stopped_by or signal.SIGTERM)  # kindling.train exits with it
        if trainer.state.fn != TrainerFn.FITTING:
            self._deadline = None
            return
        self._deadline = time.monotonic() + self.exit_within_s  # every rank saves together
        if on_slurm := SLURMEnvironment.detect():
            from kindling.run.slurm import next_hpc_checkpoint, requeue

            path = next_hpc_checkpoint(trainer.default_root_dir)
        else:
            path = self._last_checkpoint(trainer)
        trainer.save_checkpoint(path)
        self._deadline = None  # saved: the run ends as it should
        if on_slurm:
            # SIGTERM comes from SLURM itself (scontrol requeue requeues; scancel does not).
            if self.stopped_by == signal.SIGUSR1 and trainer.is_global_zero:
                requeue(path)
            return
        if finished(trainer):  # a resume would be refused: nothing is left to train
            self._say_complete(trainer, path)
            return
        rank_zero_info(
            f"Interrupted at epoch {trainer.current_epoch}, step {trainer.global_step}. "
            f"Checkpoint: {path}\n"
            f"Resume with: python train.py {shlex.quote(f'ckpt_path={path}')}"
        )
