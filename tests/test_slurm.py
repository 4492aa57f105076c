"""On a SLURM scheduler (`slurm_cluster`: a throwaway one-node cluster, or your own): the tasks
SLURM starts, and the jobs `hydra/launcher=slurm` submits."""

import csv
import json
import os
import shlex
import subprocess
import textwrap
import time
from pathlib import Path

import optuna
import pytest
import torch
import yaml
from optuna.trial import TrialState

import kindling.train
from kindling.optuna_sweep import open_storage
from kindling.report import MARKDOWN

from helpers import PYTHON, QUIET, ROOT, start_train_py
from slurm_cluster import Cluster

# The smallest runs that train, validate, test and checkpoint, on one CPU each.
SMALL = [
    "trainer.accelerator=cpu",
    "trainer.max_epochs=2",
    "debug=limit",
    "callbacks.plots=null",
    *QUIET,
]


def start_submit(
    cluster: Cluster, *args: str, cwd: Path, module_dir: Path | None = None
) -> subprocess.Popen:
    """`python train.py -m hydra/launcher=slurm <args>` started in `cwd`, as on a login node; with
    `module_dir`, the jobs can import a class a test wrote there."""
    env = dict(cluster.env)
    if module_dir is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(module_dir), env.get("PYTHONPATH")]))
    return subprocess.Popen(
        [*PYTHON, str(ROOT / "train.py"), "-m", *cluster.launcher(*args)],
        cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def submit(cluster: Cluster, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """`start_submit`, waited for."""
    started = start_submit(cluster, *args, cwd=cwd)
    stdout, stderr = started.communicate(timeout=300)
    return subprocess.CompletedProcess(started.args, started.returncode, stdout, stderr)


def test_the_cluster_starts_two_tasks_of_one_step(slurm_cluster: Cluster) -> None:
    output = slurm_cluster.run(
        "srun",
        f"--partition={slurm_cluster.partition}",
        "--ntasks=2",
        "--cpus-per-task=1",
        "--mem=100M",
        "printenv",
        "SLURM_PROCID",
    )
    assert sorted(output.split()) == ["0", "1"]


NAME_THE_RUN_FOLDER = (
    "import sys; from kindling.run.run_folder import claim, run_folder; "
    "folder = run_folder(sys.argv[1], 'train'); claim(folder); print(folder.name)"
)


@pytest.mark.slow
def test_a_jobs_tasks_name_one_run_folder_and_take_it_back_when_requeued(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """In what sbatch and srun really set: both tasks of a step name one folder, each run of the
    batch script its own, and the job requeued (a new start, the same job id) the same again."""
    name = shlex.join([*PYTHON, "-c", NAME_THE_RUN_FOLDER, str(tmp_path)])
    names = tmp_path / "names"
    script = tmp_path / "job.sh"
    script.write_text(
        textwrap.dedent(f"""\
        #!/bin/bash
        #SBATCH --ntasks=2 --cpus-per-task=1 --mem=200M --requeue --output={tmp_path}/job.out
        start=${{SLURM_RESTART_COUNT:-0}}
        srun {name} | sed "s/^/$start /" >> {names}
        {name} | sed "s/^/$start /" >> {names}
        {name} | sed "s/^/$start /" >> {names}
        if [ $start = 0 ]; then scontrol requeue $SLURM_JOB_ID; sleep 300; fi
    """)
    )
    job = slurm_cluster.run("sbatch", "--parsable", str(script)).strip()
    deadline = time.monotonic() + 120
    while len(names.read_text().splitlines() if names.exists() else []) < 8:
        assert time.monotonic() < deadline, (tmp_path / "job.out").read_text()
        time.sleep(0.2)
    each_start = [f"slurm-{job}.0", f"slurm-{job}.0", f"slurm-{job}", f"slurm-{job}-1"]
    assert names.read_text().splitlines() == [f"{n} {f}" for n in (0, 1) for f in each_start]


@pytest.mark.slow
def test_a_submission_slurm_refuses_is_one_line(slurm_cluster: Cluster, tmp_path: Path) -> None:
    """No node has a petabyte of memory: sbatch's refusal, without a traceback."""
    done = submit(slurm_cluster, *SMALL, "hydra.launcher.mem_gb=1000000", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (1, "")
    *submitting, line = done.stdout.strip().splitlines()
    assert "[HYDRA] SLURM refused the jobs: sbatch: error: " in line
    assert line.endswith("`sinfo` lists its partitions and resources.")
    assert all("[HYDRA] " in line for line in submitting)  # the sweep folder and its jobs


@pytest.mark.slow
def test_one_job_of_two_tasks_trains_as_two_processes_do(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """SLURM starts both tasks; Lightning's SLURM environment joins them (gloo) in one folder."""
    two = ["trainer.devices=2", *SMALL]
    (tmp_path / "local").mkdir()
    local = start_train_py(*two, cwd=tmp_path / "local")  # Lightning starts rank 1 itself
    done = submit(slurm_cluster, *two, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert local.wait(timeout=300) == 0, local.stdout.read()
    (sweep_dir,) = (tmp_path / "logs" / "debug" / "multiruns").iterdir()
    assert sorted(p.name for p in sweep_dir.iterdir() if p.is_dir()) == [".submitit", "0"]
    logs = "".join(p.read_text() for p in (sweep_dir / ".submitit").glob("*/*_log.*"))
    assert "MEMBER: 2/2" in logs and "Starting with 2 processes" in logs
    (local_dir,) = (tmp_path / "local" / "logs" / "debug" / "runs").iterdir()
    on_slurm = yaml.safe_load((sweep_dir / "0" / "results.yaml").read_text())
    by_hand = yaml.safe_load((local_dir / "results.yaml").read_text())
    assert on_slurm["test/acc"] == pytest.approx(by_hand["test/acc"], abs=1e-6)
    assert on_slurm["val/loss"] == pytest.approx(by_hand["val/loss"], abs=1e-6)


WAIT_FOR_SIGNAL = """
import os, time
from pathlib import Path
import lightning as L

class WaitForSignalAt(L.Callback):
    # In the middle of each training step of `steps` (gradients computed, weights not yet
    # updated), names the job in <run folder>/at_step_<step> and waits for a signal that stops
    # the run there.
    def __init__(self, steps, folders=None):  # folders: only the runs of these folder names
        self.steps, self.folders = steps, folders

    def on_before_optimizer_step(self, trainer, *args):
        here = Path(trainer.default_root_dir).name
        if trainer.global_step in self.steps and here in (self.folders or [here]):
            at_step = Path(trainer.default_root_dir, f"at_step_{trainer.global_step}")
            at_step.write_text(os.environ["SLURM_JOB_ID"])
            deadline = time.monotonic() + 30
            while not self.signalled(trainer) and time.monotonic() < deadline:
                time.sleep(0.05)

    def signalled(self, trainer):  # kindling's handler raises its flag; the step ends later
        return any(getattr(c, "stopped_by", None) for c in trainer.callbacks)
"""


def epochs_and_last_val_loss(run_dir: Path) -> tuple[list[str], list[str], float]:
    with open(run_dir / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    trained = [r["epoch"] for r in rows if r["train/loss"]]
    validated = [r["epoch"] for r in rows if r["val/loss"]]
    return trained, validated, float([r["val/loss"] for r in rows if r["val/loss"]][-1])


@pytest.mark.slow
def test_a_job_stopped_by_slurm_requeues_and_ends_as_an_uninterrupted_run(
    slurm_cluster: Cluster, compose_config, tmp_path: Path
) -> None:
    """In the middle of a step of each epoch: first SIGUSR1 (what SLURM sends before a time
    limit: the job requeues itself), then `scontrol requeue` (SLURM sends SIGTERM and requeues
    the job). The job checkpoints at the end of each of those steps, and each start of the job
    resumes where the last stopped."""
    exact = ["trainer.deterministic=true", "test=false", *SMALL]
    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / "slurm_signal.py").write_text(textwrap.dedent(WAIT_FOR_SIGNAL))
    wait = ["+callbacks.wait._target_=slurm_signal.WaitForSignalAt", "+callbacks.wait.steps=[3,7]"]
    job = start_submit(slurm_cluster, *exact, *wait, cwd=tmp_path, module_dir=tmp_path / "modules")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as the job's one CPU has it (OMP_NUM_THREADS): the same sums
    try:
        kindling.train.run(compose_config(*exact))  # the same run, uninterrupted, meanwhile
    finally:
        torch.set_num_threads(threads)
    stops = {3: ["scancel", "--signal=USR1"], 7: ["scontrol", "requeue"]}
    for step, stop in stops.items():
        deadline = time.monotonic() + 120
        while not (at_step := list(tmp_path.glob(f"logs/debug/multiruns/*/0/at_step_{step}"))):
            assert job.poll() is None and time.monotonic() < deadline, job.communicate()
            time.sleep(0.2)
        slurm_cluster.run(*stop, at_step[0].read_text())
    _, stderr = job.communicate(timeout=300)
    assert job.returncode == 0, stderr
    run_dir = at_step[0].parent
    (script,) = run_dir.parent.glob(".submitit/*/*_submission.sh")
    assert "#SBATCH --signal=USR1@120" in script.read_text()  # what the time limit sends too
    assert sorted(p.name for p in run_dir.glob("hpc_ckpt_*")) == [
        "hpc_ckpt_1.ckpt",
        "hpc_ckpt_2.ckpt",
    ]
    trained, validated, val_loss = epochs_and_last_val_loss(run_dir)
    assert trained == validated == ["0", "1"]  # each epoch once, the interrupted ones too
    assert val_loss == pytest.approx(epochs_and_last_val_loss(tmp_path / "run")[2], abs=1e-6)


@pytest.mark.slow
def test_a_cancelled_job_ends_and_its_folder_says_so(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """`scancel` mid-step: SLURM sends SIGTERM; the job checkpoints at the end of the step and
    ends, its job.yaml says `interrupted`, and the sweep says in one line that the job left no
    result (SLURM's state CANCELLED) and where its folder is."""
    (tmp_path / "modules").mkdir()
    (tmp_path / "modules" / "slurm_signal.py").write_text(textwrap.dedent(WAIT_FOR_SIGNAL))
    wait = ["+callbacks.wait._target_=slurm_signal.WaitForSignalAt", "+callbacks.wait.steps=[3]"]
    sweep = start_submit(
        slurm_cluster, *SMALL, *wait, cwd=tmp_path, module_dir=tmp_path / "modules"
    )
    deadline = time.monotonic() + 120
    while not (at_step := list(tmp_path.glob("logs/debug/multiruns/*/0/at_step_3"))):
        assert sweep.poll() is None and time.monotonic() < deadline, sweep.communicate()
        time.sleep(0.2)
    slurm_cluster.run("scancel", at_step[0].read_text())
    said = "".join(sweep.communicate(timeout=120))
    assert sweep.returncode == 1
    assert "Traceback" not in said and "(state: CANCELLED)" in said, said
    run_dir = at_step[0].parent
    record = yaml.safe_load((run_dir / "job.yaml").read_text())
    assert (record["status"], record["exit_code"]) == ("interrupted", 143)
    assert (run_dir / "hpc_ckpt_1.ckpt").is_file()
    assert not slurm_cluster.run("squeue", "--noheader").strip()


RECORD_PARAMS = """
import json
from pathlib import Path
import lightning as L

class RecordParams(L.Callback):
    # What this rank trains with, in <run folder>/rank<r>.json.
    def on_train_start(self, trainer, pl_module):
        record = {
            "model.optimizer.lr": trainer.optimizers[0].defaults["lr"],
            "data.batch_size": trainer.datamodule.hparams.batch_size,
        }
        folder = Path(trainer.default_root_dir)
        (folder / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))
"""


@pytest.mark.slow
def test_an_optuna_sweep_runs_its_trials_as_slurm_jobs(
    slurm_cluster: Cluster, tmp_path: Path
) -> None:
    """Two trials as two SLURM jobs at once, each of two tasks: both ranks of a trial train with
    its parameters; trial 0, preempted (SIGUSR1) mid-step, requeues itself and resumes; the study
    ends with two trials, each counted once; each job trained and tested in its folder, and the
    multirun's report lists both."""
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "slurm_signal.py").write_text(textwrap.dedent(WAIT_FOR_SIGNAL))
    (modules / "record_params.py").write_text(textwrap.dedent(RECORD_PARAMS))
    overrides = [
        "hparams_search=optuna", "hparams_search/pruner=nop", "hydra.sweeper.n_trials=2",
        "hydra.sweeper.n_jobs=2", "trainer.devices=2", *SMALL,
        "+callbacks.params._target_=record_params.RecordParams",
        "+callbacks.wait._target_=slurm_signal.WaitForSignalAt", "+callbacks.wait.steps=[3]",
        "+callbacks.wait.folders=['0']",
    ]  # fmt: skip
    sweep = start_submit(slurm_cluster, *overrides, cwd=tmp_path, module_dir=modules)
    deadline = time.monotonic() + 120
    while not (at_step := list(tmp_path.glob("logs/debug/multiruns/*/0/at_step_3"))):
        assert sweep.poll() is None and time.monotonic() < deadline, sweep.communicate()
        time.sleep(0.2)
    slurm_cluster.run("scancel", "--signal=USR1", at_step[0].read_text())
    stdout, stderr = sweep.communicate(timeout=300)
    assert sweep.returncode == 0, stdout + stderr
    journal = tmp_path / "logs" / "debug" / "sweeps" / "optuna" / "journal.log"
    study = optuna.load_study(study_name="optuna", storage=open_storage(str(journal)))
    assert [(t.number, t.state) for t in study.trials] == [
        (n, TrialState.COMPLETE) for n in range(2)
    ]
    sweep_dir = at_step[0].parent.parent
    for trial in study.trials:
        run_dir = sweep_dir / str(trial.number)
        ranks = [json.loads((run_dir / f"rank{r}.json").read_text()) for r in (0, 1)]
        searched = {k: v for k, v in trial.params.items() if k in ranks[0]}
        assert ranks[0] == ranks[1] == pytest.approx(searched)
        results = yaml.safe_load((run_dir / "results.yaml").read_text())
        assert 0.0 <= results["test/acc"] <= 1.0  # tested (a sampled lr may not beat chance)
        assert (run_dir / "checkpoints" / "last.ckpt").is_file()
    report = (sweep_dir / MARKDOWN).read_text().splitlines()
    completed = {line.split(" | ")[0] for line in report if " | completed | " in line}
    assert {"| 0", "| 1"} <= completed  # a line per job
    assert (sweep_dir / "0" / "hpc_ckpt_1.ckpt").is_file()  # trial 0 stopped once, resumed
    trained, validated, _ = epochs_and_last_val_loss(sweep_dir / "0")
    assert trained == validated == ["0", "1"]
