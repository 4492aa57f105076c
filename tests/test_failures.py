"""A part that fails under a run (a full disk, a rank that dies) ends it with one line that
names what failed and the command that resumes it, in train.log too; the resume then ends with
every epoch once."""

import errno
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch

import kindling.checkpoints
from kindling.train import run

from helpers import QUIET, error_lines, read_metrics, running, start_train_py, train_py

EPOCHS = ["trainer.max_epochs=4", "debug=limit", "test=false", *QUIET]


class FullDisk:
    """A file whose device fills after `room` bytes: its writes then fail as a full disk's do."""

    def __init__(self, file, room: int) -> None:
        self.file, self.room = file, room

    def write(self, data) -> int:
        if self.room < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.file.write(data)

    def __getattr__(self, name: str):
        return getattr(self.file, name)


def test_a_full_disk_is_one_line_leaves_no_part_file_and_the_resume_keeps_every_epoch(
    compose_config, monkeypatch, caplog, tmp_path: Path
) -> None:
    saves = []
    real_save = torch.save

    def save_until_full(checkpoint, file, *args, **kwargs) -> None:
        saves.append(checkpoint["epoch"])
        full = checkpoint["epoch"] == 2  # epochs 0 and 1 fit; epoch 2's checkpoint does not
        real_save(checkpoint, FullDisk(file, 10_000) if full else file, *args, **kwargs)

    monkeypatch.setattr(kindling.checkpoints.torch, "save", save_until_full)
    with pytest.raises(SystemExit) as stopped:
        run(compose_config(*EPOCHS))
    assert stopped.value.code == 1
    run_dir = tmp_path / "run"
    last = run_dir / "checkpoints" / "last.ckpt"
    (line,) = error_lines(caplog)
    assert re.fullmatch(
        rf"No space left on the device of {run_dir} \(\d+\.\d MB free\); no "
        rf"checkpoint is half-written\. The newest intact checkpoint is {last} \(\d+\.\d MB\)\. "
        rf"Make room or move the run folder, then resume with: python train\.py ckpt_path={last}",
        line,
    ), line
    assert not [p.name for p in last.parent.iterdir() if p.name.endswith(".tmp")]
    assert torch.load(last, weights_only=True)["epoch"] == 1  # the previous one, whole

    monkeypatch.setattr(kindling.checkpoints.torch, "save", real_save)  # room again
    run(compose_config(*EPOCHS, f"ckpt_path={last}"))
    epochs = [int(row["epoch"]) for row in read_metrics(run_dir) if row.get("val/loss")]
    assert epochs == [0, 1, 2, 3]


EPOCHS_OF_A_KILLED_RUN = 10
KILLED_AFTER_FIRST_CHECKPOINT = [
    "trainer.accelerator=cpu", "trainer.devices=2", f"trainer.max_epochs={EPOCHS_OF_A_KILLED_RUN}",
    "test=false",
    "debug=limit", *QUIET, "callbacks.plots=null", "callbacks.device_report=null",
    "+callbacks.pids._target_=rank_pids.RankPids",
]  # fmt: skip

RANK_PIDS = """
import os
import signal
import time
from pathlib import Path

import lightning as L


class RankPids(L.Callback):
    def setup(self, trainer, module, stage):
        Path(f"rank{trainer.global_rank}.pid").write_text(str(os.getpid()))  # in its folder


class RankOneDiesInRankZerosLongStep(L.Callback):
    \"\"\"Once: rank 1 ends at step 12 while rank 0 spends 8 s there, out of any collective.\"\"\"

    def on_train_batch_end(self, trainer, *args):
        mark = Path(f"step_12_of_rank_{trainer.global_rank}")
        if trainer.global_step != 12 or mark.exists():  # the resumed run goes on
            return
        mark.write_text("")
        if trainer.global_rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(8)  # Lightning's watchdog looks every 5 s
"""

# Where the launching process learns of the lost rank: at its next collective (killed from
# outside), or from Lightning's watchdog over the ranks it started (a long step), which kills it.
CASES = {
    "rank 1": ("Rank 1 of this 2-process run ended (killed by SIGKILL): rank 0 stopped", 1),
    "rank 0": ("Another rank of this 2-process run ended (its connection closed): rank 1 "
               "stopped", -9),  # the process the test started is rank 0
    "rank 1 in rank 0's long step": (
        "Rank 1 of this 2-process run ended (killed by SIGKILL): rank 0 stopped", -9),
}  # fmt: skip


@pytest.mark.slow
def test_a_rank_that_dies_ends_the_other_with_one_line_and_the_resume_line(tmp_path: Path) -> None:
    (tmp_path / "rank_pids.py").write_text(RANK_PIDS)
    runs = {}
    for number, case in enumerate(CASES):
        folder = tmp_path / f"case_{number}"
        folder.mkdir()
        args = [*KILLED_AFTER_FIRST_CHECKPOINT, "hydra.run.dir=run"]
        if case == "rank 1 in rank 0's long step":
            args.append("+callbacks.dies._target_=rank_pids.RankOneDiesInRankZerosLongStep")
        runs[case] = folder, args, start_train_py(*args, cwd=folder, module_dir=tmp_path)
    for case, (folder, _, process) in runs.items():
        if case in ("rank 1", "rank 0"):
            last = folder / "run" / "checkpoints" / "last.ckpt"
            deadline = time.monotonic() + 120
            while not (last.is_file() and (folder / "rank1.pid").is_file()):
                assert process.poll() is None and time.monotonic() < deadline, process.stdout
                time.sleep(0.1)
            os.kill(int((folder / f"{case.replace(' ', '')}.pid").read_text()), signal.SIGKILL)
    for case, (folder, _, process) in runs.items():
        for pid in [int(f.read_text()) for f in folder.glob("rank*.pid")]:  # rank 1 may outlive
            deadline = time.monotonic() + 90  # the process the test started: its line comes last
            while running(pid):
                assert time.monotonic() < deadline, f"{case}: pid {pid} still runs"
                time.sleep(0.1)
        output = process.communicate(timeout=90)[0]
        said, exit_code = CASES[case]
        assert process.returncode == exit_code, (case, output[-3000:])
        last = folder / "run" / "checkpoints" / "last.ckpt"
        lines = [line for line in output.splitlines() if said in line]
        assert len(lines) == 1, (case, output[-3000:])
        assert lines[0].endswith(f"Resume with: python train.py ckpt_path={last}"), lines[0]
        assert "Traceback" not in output, output[-3000:]
        assert said in (folder / "run" / "train.log").read_text(), case

    # The resume line works: the run whose launching process died, resumed, has every epoch once
    # (the other cases leave the same checkpoint, written whole, and resume the same way).
    folder, args, _ = runs["rank 0"]
    last = folder / "run" / "checkpoints" / "last.ckpt"
    resumed = train_py(*args, f"ckpt_path={last}", cwd=folder, module_dir=tmp_path)
    assert resumed.returncode == 0, (resumed.stdout + resumed.stderr)[-3000:]
    epochs = [int(r["epoch"]) for r in read_metrics(folder / "run") if r.get("val/loss")]
    assert epochs == list(range(EPOCHS_OF_A_KILLED_RUN)), epochs
