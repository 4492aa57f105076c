"""One folder per run, whatever starts runs together; one folder for all ranks of a launch."""

import multiprocessing
import multiprocessing.synchronize
import re
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import OmegaConf

from kindling.errors import UserError
from kindling.run import launched, run_folder
from kindling.train import run

from helpers import (
    CONFIG_DIR,
    QUIET,
    copy_run,
    error_lines,
    folder_contents,
    start_train_py,
    train_py,
    train_py_here,
)

LAUNCHER_VARIABLES = [
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "RANK", "WORLD_SIZE", "SLURM_JOB_ID",
    "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID", "SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS",
    "SLURM_PROCID", "SLURM_RESTART_COUNT",
]  # fmt: skip


def new_process(monkeypatch) -> None:
    """A process just started: the launcher's variables alone, and no folder named yet."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    run_folder._new_folder.cache_clear()


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch) -> Iterator[None]:
    """A plain process, whatever launched pytest; the next test names its folders anew."""
    new_process(monkeypatch)
    yield
    new_process(monkeypatch)


def test_runs_started_by_hand_in_the_same_second_get_a_folder_each(
    tmp_path: Path, monkeypatch
) -> None:
    """Nothing claims the name: its random part sets apart runs that start in the same second
    (a shell loop, several machines writing one log folder)."""

    class SameSecond(datetime):
        @classmethod
        def now(cls, tz=None) -> datetime:
            return cls(2026, 1, 1, 12, 0, 0, 123456)

    monkeypatch.setattr(run_folder, "datetime", SameSecond)
    folders, sweeps = set(), set()
    for _ in range(100):
        new_process(monkeypatch)
        folders.add(run_folder.run_folder(str(tmp_path), "train"))
        sweeps.add(run_folder.sweep_folder(str(tmp_path), "train"))
    assert len(folders) == len(sweeps) == 100
    assert all(re.fullmatch(r"2026-01-01_12-00-00_[0-9a-f]{8}", f.name) for f in folders)
    assert {f.parent for f in folders} == {tmp_path / "train" / "runs"}
    assert not any(tmp_path.iterdir())  # named, not made: Hydra makes the one it runs in


def torchrun_rank(monkeypatch, rank: int, run_id: str, *, restart: int = 0) -> None:
    """What torchrun gives worker `rank` of a launch of 2 (LocalElasticAgent._start_workers)."""
    new_process(monkeypatch)
    env = {
        "TORCHELASTIC_RUN_ID": run_id,
        "TORCHELASTIC_RESTART_COUNT": str(restart),
        "RANK": str(rank),
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)


def test_torchrun_ranks_name_one_folder_each_launch_its_own(tmp_path: Path, monkeypatch) -> None:
    launch = str(uuid.uuid4())  # what --standalone gives
    # Rank 1 may start first: it names the folder at once, waiting for no other rank.
    torchrun_rank(monkeypatch, 1, launch)
    folder = run_folder.run_folder(str(tmp_path), "train")
    sweep = run_folder.sweep_folder(str(tmp_path), "train")
    torchrun_rank(monkeypatch, 0, launch)
    assert run_folder.run_folder(str(tmp_path), "train") == folder
    assert run_folder.sweep_folder(str(tmp_path), "train") == sweep
    assert folder == tmp_path / "train" / "runs" / f"torchrun-{launch}"
    assert sweep == str(tmp_path / "train" / "multiruns" / f"torchrun-{launch}")
    assert not any(tmp_path.iterdir())  # no rank left anything for another to read

    torchrun_rank(monkeypatch, 0, str(uuid.uuid4()))  # the same command again
    assert run_folder.run_folder(str(tmp_path), "train") != folder
    torchrun_rank(monkeypatch, 1, launch, restart=1)  # torchrun restarting its workers
    assert run_folder.run_folder(str(tmp_path), "train").name == f"torchrun-{launch}-1"


def test_torchrun_without_a_run_id_of_its_own_is_refused(tmp_path: Path, monkeypatch) -> None:
    """`--master-port` or `--nnodes=2` without `--rdzv-id`: every launch has the id `none`."""
    torchrun_rank(monkeypatch, 0, "none")
    with pytest.raises(UserError, match=r"--standalone on one node, or --rdzv-id="):
        run_folder.run_folder(str(tmp_path), "train")
    monkeypatch.setenv("SLURM_JOB_ID", "4242")  # inside a SLURM job, the job names it
    assert run_folder.run_folder(str(tmp_path), "train").name == "slurm-4242"


def slurm_task(monkeypatch, argv: list[str], *, restart: int = 0, **env: str) -> None:
    """A process of SLURM job 4242 (the environment srun, or sbatch, gives it) running `argv`."""
    new_process(monkeypatch)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    if restart:  # SLURM sets it from the first requeue on
        monkeypatch.setenv("SLURM_RESTART_COUNT", str(restart))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])


def test_srun_tasks_name_one_folder_and_a_requeued_job_takes_it_back(
    tmp_path: Path, monkeypatch
) -> None:
    def folders(rank: int, restart: int = 0) -> tuple[Path, str]:
        step = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_PROCID": str(rank)}
        slurm_task(monkeypatch, ["trainer.devices=2"], restart=restart, **step)
        log_dir = str(tmp_path)
        named = run_folder.run_folder(log_dir, "train"), run_folder.sweep_folder(log_dir, "train")
        for folder in named:
            run_folder.claim(folder)  # as the run, and the multirun, do when they start
        return named

    first = folders(1)  # task 1 may start first: it waits for no other task
    assert first == (tmp_path / "train" / "runs" / "slurm-4242.0",
                     str(tmp_path / "train" / "multiruns" / "slurm-4242.0"))  # fmt: skip
    assert folders(0) == first
    # Requeued (scontrol requeue, or kindling at a time limit): the same job id, started again.
    assert folders(0, restart=1) == folders(1, restart=1) == first
    assert folders(1, restart=2) == folders(0, restart=2) == first


def test_runs_in_one_slurm_job_step_get_a_folder_each_and_take_them_back_when_requeued(
    tmp_path: Path, monkeypatch
) -> None:
    """A batch script that trains, then tests, or a shell inside an allocation, starts several
    runs under one name: the claim sets them apart, by command line and in order."""

    def folder(argv: list[str], **env) -> str:
        slurm_task(monkeypatch, argv, **env)
        named = run_folder.run_folder(str(tmp_path), "train")
        run_folder.claim(named)  # as the run does when it starts
        return named.name

    def torchrun(argv: list[str], rank: int, **env) -> str:  # torchrun in the batch script
        launch = {"TORCHELASTIC_RUN_ID": "none", "RANK": str(rank), "WORLD_SIZE": "2"}
        return folder(argv, **launch, **env)

    assert folder(["model=cnn"], SLURM_STEP_ID="0") == "slurm-4242.0"
    assert folder(["model=cnn"], SLURM_STEP_ID="1") == "slurm-4242.1"  # another srun step
    # Runs in the batch script itself, one after the other or side by side: a folder each.
    assert folder(["model=lstm"]) == "slurm-4242"
    assert folder(["model=cnn"]) == "slurm-4242-1"
    assert folder(["model=cnn"]) == "slurm-4242-2"
    assert torchrun(["model=cnn"], 1) == torchrun(["model=cnn"], 0) == "slurm-4242-3"
    # The job requeued: each command line takes back a folder it had, with its checkpoints.
    assert folder(["model=cnn"], restart=1) == "slurm-4242-1"
    assert folder(["model=lstm"], restart=1) == "slurm-4242"
    assert torchrun(["model=cnn"], 1, restart=1) == "slurm-4242-3"
    assert torchrun(["model=cnn"], 0, restart=1) == "slurm-4242-3"
    assert folder(["model=cnn"], restart=1) == "slurm-4242-2"
    assert folder(["model=cnn"], restart=1, SLURM_STEP_ID="0") == "slurm-4242.0"
    slurm_task(monkeypatch, [], SLURM_ARRAY_JOB_ID="4200", SLURM_ARRAY_TASK_ID="3")
    assert launched.slurm_name() == "slurm-4200_3"


def composed(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    GlobalHydra.instance().clear()
    return cfg


def test_the_composed_config_names_run_and_sweep_folders(tmp_path: Path, monkeypatch) -> None:
    cfg = composed(f"paths.log_dir={tmp_path}")
    run_dir = Path(OmegaConf.select(cfg, "hydra.run.dir"))
    assert run_dir.parent == tmp_path / "train" / "runs"
    assert OmegaConf.select(cfg, "hydra.run.dir") == str(run_dir)  # named once
    sweep_dir = Path(OmegaConf.select(cfg, "hydra.sweep.dir"))
    assert sweep_dir.parent == tmp_path / "train" / "multiruns"

    new_process(monkeypatch)
    monkeypatch.setenv("SLURM_JOB_ID", "777")
    cfg = composed(f"paths.log_dir={tmp_path}", "hydra/launcher=slurm")
    assert OmegaConf.select(cfg, "hydra.run.dir") == str(tmp_path / "train" / "runs" / "slurm-777")
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")


# A run of one training and one validation batch, untested: enough to fill its folder.
TINY = [
    "data=digits", "trainer=cpu", "debug=limit", "trainer.max_epochs=1",
    "trainer.limit_train_batches=1", "trainer.limit_val_batches=1", "test=false", *QUIET,
]  # fmt: skip


@pytest.mark.slow
def test_runs_and_multiruns_started_together_get_complete_folders_of_their_own(
    tmp_path: Path,
) -> None:
    """Two runs and two multiruns (two jobs each) started at once, as a shell loop does."""
    commands = [[]] * 2 + [["-m", "seed=1,2"]] * 2
    processes = [start_train_py(*args, *TINY, cwd=tmp_path) for args in commands]
    for process in processes:
        output, _ = process.communicate(timeout=600)
        assert process.returncode == 0, output[-3000:]
    runs = sorted((tmp_path / "logs" / "debug" / "runs").iterdir())
    sweeps = sorted((tmp_path / "logs" / "debug" / "multiruns").iterdir())
    assert len(runs) == 2 and len(sweeps) == 2
    jobs = [sweep / job for sweep in sweeps for job in ("0", "1")]
    for folder in runs + jobs:
        assert (folder / ".hydra" / "config.yaml").is_file(), folder
        assert (folder / "checkpoints" / "last.ckpt").is_file(), folder
        rows = (folder / "csv" / "metrics.csv").read_text().splitlines()
        assert len([r for r in rows if r.startswith("0,")]) == 2, folder  # train and val, once


def hold_in_another_process(folder: Path) -> multiprocessing.Process:
    """A process that holds `folder`'s lock until it is killed (forked: no imports to pay)."""
    fork = multiprocessing.get_context("fork")
    held = fork.Event()
    holder = fork.Process(target=_hold, args=(folder, held), daemon=True)
    holder.start()
    assert held.wait(60)
    return holder


def _hold(folder: Path, held: multiprocessing.synchronize.Event) -> None:
    run_folder.hold(folder)
    held.set()
    time.sleep(600)


def test_a_folder_held_by_a_live_process_is_refused_and_free_once_it_is_killed(
    tmp_path: Path, monkeypatch
) -> None:
    holder = hold_in_another_process(tmp_path)
    try:
        with pytest.raises(UserError, match=rf"{tmp_path} is in use by process {holder.pid} on "):
            run_folder.hold(tmp_path)
        # The other ranks of the holder's own job share its folder: they take no lock.
        monkeypatch.setattr(rank_zero_only, "rank", 1)
        run_folder.hold(tmp_path)
        monkeypatch.undo()
        monkeypatch.setenv("NODE_RANK", "1")  # the first process of a second node
        run_folder.hold(tmp_path)
        monkeypatch.undo()
    finally:
        holder.kill()  # SIGKILL: no chance to clean up
        holder.join()
    run_folder.hold(tmp_path)  # the operating system released the lock of the killed process
    run_folder.release(tmp_path)


@pytest.mark.slow
def test_a_second_resume_of_a_live_run_is_refused_naming_it(
    trained_run, compose_config, tmp_path: Path, caplog
) -> None:
    run_dir = copy_run(trained_run, tmp_path / "run")
    resume = f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}"
    first = start_train_py("trainer=cpu", "trainer.max_epochs=100", resume, *QUIET, cwd=tmp_path)
    try:
        while not (run_dir / "csv" / "hparams_resumed_1.yaml").exists():  # it logs: it runs
            assert first.poll() is None, first.stdout.read()
            time.sleep(0.1)
        with pytest.raises(SystemExit) as stopped:
            run(compose_config("trainer=cpu", "trainer.max_epochs=5", resume, *QUIET))
    finally:
        first.kill()
        first.wait()
    assert stopped.value.code == 1
    (line,) = error_lines(caplog)
    assert f"{run_dir} is in use by process {first.pid} on " in line
    assert "train.py" in line  # its command
    assert not (run_dir / "csv" / "hparams_resumed_2.yaml").exists()


def test_train_py_refuses_a_torchrun_launch_without_an_id_in_one_line(
    tmp_path: Path, monkeypatch
) -> None:
    """Before Hydra composes: a refusal while it resolves the run folder would end a traceback."""
    for name, value in {"TORCHELASTIC_RUN_ID": "none", "RANK": "0", "WORLD_SIZE": "1"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    result = train_py("trainer.max_epochs=1", cwd=tmp_path)
    assert result.returncode == 1
    (line,) = (result.stdout + result.stderr).strip().splitlines()
    assert line.startswith("torchrun started this run without an id of its own")
    assert not (tmp_path / "logs").exists()


@pytest.mark.slow
@pytest.mark.parametrize("multirun", [False, True], ids=["run", "multirun job"])
def test_a_new_run_in_an_earlier_runs_folder_is_refused_and_leaves_it_as_it_was(
    trained_run, tmp_path: Path, multirun: bool
) -> None:
    """`hydra.run.dir=` (or `hydra.sweep.dir=`) naming an earlier run's folder: a new run there
    would replace its checkpoints, metrics and record. One line names the resume instead."""
    run_dir = copy_run(trained_run, tmp_path / "sweep" / "0" if multirun else tmp_path / "run")
    # Hydra opens train.log before kindling runs; .lock names the last process that held it.
    changed = ("train.log", ".lock")
    before = folder_contents(run_dir, but=changed)
    where = (
        ["-m", f"hydra.sweep.dir={run_dir.parent}"] if multirun else [f"hydra.run.dir={run_dir}"]
    )
    result = train_py_here(*where, "trainer=cpu", *QUIET, cwd=tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output[-3000:]
    resume = f"ckpt_path={run_dir / 'checkpoints' / 'last.ckpt'}"
    assert f"{run_dir} holds an earlier run" in output and resume in output, output[-3000:]
    assert "Traceback" not in output
    assert folder_contents(run_dir, but=changed) == before


def test_a_process_that_runs_again_in_another_folder_names_a_new_folder(
    tmp_path: Path, monkeypatch
) -> None:
    """`logs` is relative: a process that runs a second multirun (or run) in another working
    folder gets new folders there, not the first's name again; resolved again in one folder,
    the same (the config is resolved many times)."""
    new_process(monkeypatch)
    named = []
    for folder in ("first", "second", "second"):
        (tmp_path / folder).mkdir(exist_ok=True)
        monkeypatch.chdir(tmp_path / folder)
        named.append(
            (run_folder.sweep_folder("logs", "debug"), run_folder.run_folder("logs", "train"))
        )
    assert named[0][0] != named[1][0] and named[0][1] != named[1][1]
    assert named[1] == named[2]
