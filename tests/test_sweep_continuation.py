"""A multirun killed part-way is continued by its own command and `hydra.sweep.dir=<its folder>`
(kindling/run/continuation.py): the completed job is kept byte for byte, the interrupted one
resumes exactly, the one never started runs, and the report counts all of them."""

import functools
import re
import shlex
from pathlib import Path

import pytest
import yaml

from helpers import QUIET, folder_contents, module_here, read_metrics
from helpers import train_py as train_py_

EPOCHS = 6
# Kills its own process at step 23 (epoch 4 of 5-step epochs) of job 1, once: the multirun ends
# as under `kill -9`, its job 0 complete and job 2 not started.
KILL_JOB_1 = """
import os
import signal
from pathlib import Path

import lightning as L
from hydra.core.hydra_config import HydraConfig


class KillJobOne(L.Callback):
    def on_train_batch_end(self, trainer, *args):
        if HydraConfig.get().job.get("num") != 1:
            return
        with open("job_1_steps", "a") as steps:  # the steps job 1 trained, each attempt
            steps.write(f"{trainer.global_step}\\n")
        marker = Path("killed")
        if trainer.global_step == 23 and not marker.exists():
            marker.write_text("")
            os.kill(os.getpid(), signal.SIGKILL)
"""

JOB = ["debug=limit", f"trainer.max_epochs={EPOCHS}", "trainer.deterministic=true",
       "callbacks.plots=null", "+callbacks.kill._target_=kill_job.KillJobOne", *QUIET]  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_a_killed_multirun_continues_without_repeating_its_completed_job(
    tmp_path: Path, launcher: str
) -> None:
    (tmp_path / "kill_job.py").write_text(KILL_JOB_1)
    sweep = tmp_path / "sweep"
    # One joblib worker at a time: jobs 0 and 1 in parallel would both be cut off by the kill.
    launch = (
        [] if launcher == "basic" else [f"hydra/launcher={launcher}", "hydra.launcher.n_jobs=1"]
    )
    command = ["-m", "seed=0,1,2", *JOB, *launch, f"hydra.sweep.dir={sweep}"]
    # joblib's pool of workers cannot be forked from this process: a new interpreter.
    train_py = functools.partial(train_py_, new_interpreter=launcher == "joblib")
    killed = train_py(*command, cwd=tmp_path, module_dir=tmp_path)
    if launcher == "joblib":  # a worker was killed: joblib ends the multirun with its error
        assert "TerminatedWorkerError" in killed.stderr or killed.returncode != 0
    else:
        assert killed.returncode == -9, (killed.stdout + killed.stderr)[-3000:]
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]

    # The report of the cut-off multirun: every job, the way on.
    report = module_here("kindling.report", str(sweep), cwd=tmp_path).stdout
    statuses = re.findall(r"^\| (\d) \| seed=\d \| (\w+(?: \w+)?) \|", report, re.M)
    assert statuses == [("0", "completed"), ("1", "interrupted"), ("2", "not started")], report
    line = re.search(r"^2 jobs did not finish\. Continue it with: python train\.py (.*)$",
                     report, re.M)  # fmt: skip
    assert line and shlex.split(line[1]) == command, report

    job_0 = folder_contents(sweep / "0")
    continued = train_py(*shlex.split(line[1]), cwd=tmp_path, module_dir=tmp_path)
    output = continued.stdout + continued.stderr
    assert continued.returncode == 0, output[-3000:]
    assert folder_contents(sweep / "0") == job_0  # kept, not run again
    assert f"{sweep / '0'} completed before: kept as it is." in output
    for job in ("1", "2"):
        assert yaml.safe_load((sweep / job / "job.yaml").read_text())["status"] == "completed"
        epochs = [int(r["epoch"]) for r in read_metrics(sweep / job) if r.get("val/loss")]
        assert epochs == list(range(EPOCHS)), (job, epochs)
    assert "3/3" in (sweep / "report.md").read_text()
    # Job 1 went on from its last checkpoint (epoch 3's end, step 20), not from the start.
    steps = [int(step) for step in (tmp_path / "job_1_steps").read_text().split()]
    assert steps == [*range(1, 24), *range(21, EPOCHS * 5 + 1)], steps

    # Job 1, resumed, ends as it would have uninterrupted.
    alone = train_py("seed=1", *JOB, "hydra.run.dir=alone", cwd=tmp_path, module_dir=tmp_path)
    assert alone.returncode == 0, (alone.stdout + alone.stderr)[-3000:]
    expected = yaml.safe_load((tmp_path / "alone" / "results.yaml").read_text())
    resumed = yaml.safe_load((sweep / "1" / "results.yaml").read_text())
    assert resumed == pytest.approx(expected, abs=1e-6)
