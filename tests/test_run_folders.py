"""One folder per run, whatever starts runs together; one folder for all ranks of a launch."""

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from lightning.pytorch.utilities import rank_zero_only
from omegaconf import OmegaConf

from kindling.config.errors import UserError
from kindling.run import folder_lock, run_folder
from kindling.train import run

from conftest import CONFIG_DIR, PYTHON, QUIET, copy_run, error_lines, start_train_py

LAUNCHER_VARIABLES = [
    "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "RANK", "GROUP_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID",
    "SLURM_STEP_ID", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_RESTART_COUNT",
]  # fmt: skip


@pytest.fixture(autouse=True)
def no_launcher(monkeypatch) -> None:
    """A plain process, whatever launched pytest; and no folder claimed by an earlier test."""
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(run_folder, "_claimed", {})


def new_process(monkeypatch) -> None:
    """What run_folder sees in another process: nothing claimed yet."""
    monkeypatch.setattr(run_folder, "_claimed", {})


def test_the_stamp_has_milliseconds() -> None:
    assert re.fullmatch(r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\.\d{3}", run_folder.run_stamp())


def test_runs_claiming_one_name_at_once_get_a_folder_each(tmp_path: Path) -> None:
    """16 runs started in the same millisecond: mkdir has one winner, the others take -1, -2..."""
    claimed: list[Path] = []
    start = threading.Barrier(16)

    def claim() -> None:
        start.wait()
        claimed.append(run_folder.claim_folder(tmp_path / "runs", "2026-01-01_00-00-00.000"))

    threads = [threading.Thread(target=claim) for _ in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(claimed)) == 16
    assert all(folder.is_dir() for folder in claimed)
    assert {f.name for f in claimed} == {"2026-01-01_00-00-00.000"} | {
        f"2026-01-01_00-00-00.000-{n}" for n in range(1, 16)
    }


def torchrun_rank(monkeypatch, rank: int, *, agent_pid: int, restart: int = 0) -> None:
    """The environment torchrun gives a worker (static rendezvous, the default run id)."""
    new_process(monkeypatch)
    env = {
        "TORCHELASTIC_RUN_ID": "none",
        "TORCHELASTIC_RESTART_COUNT": str(restart),
        "RANK": str(rank),
        "GROUP_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr("os.getppid", lambda: agent_pid)


def test_torchrun_ranks_share_the_folder_and_later_launches_do_not(
    tmp_path: Path, monkeypatch
) -> None:
    log_dir = str(tmp_path)
    torchrun_rank(monkeypatch, 0, agent_pid=1000)
    first = run_folder.run_folder(log_dir, "train")
    torchrun_rank(monkeypatch, 1, agent_pid=1000)
    assert run_folder.run_folder(log_dir, "train") == first

    # The same command again: the same run id, address and port, another torchrun agent. Its
    # rank 1 may start before its rank 0 has named the folder: it must wait, not take the
    # folder the first launch left behind.
    torchrun_rank(monkeypatch, 1, agent_pid=2000)
    with pytest.raises(TimeoutError):
        run_folder.run_folder(log_dir, "train", timeout_s=0.2)
    torchrun_rank(monkeypatch, 0, agent_pid=2000)
    second = run_folder.run_folder(log_dir, "train")
    torchrun_rank(monkeypatch, 1, agent_pid=2000)
    assert run_folder.run_folder(log_dir, "train") == second != first

    # torchrun restarting its workers (--max-restarts) is a new launch too.
    torchrun_rank(monkeypatch, 1, agent_pid=2000, restart=1)
    with pytest.raises(TimeoutError):
        run_folder.run_folder(log_dir, "train", timeout_s=0.2)


def slurm_task(monkeypatch, argv: list[str], *, restart: int = 0, **env: str) -> None:
    new_process(monkeypatch)
    for name in LAUNCHER_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_RESTART_COUNT", str(restart))
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setattr(sys, "argv", ["train.py", *argv])


def test_slurm_runs_get_a_folder_each_and_a_requeued_job_finds_its_own(
    tmp_path: Path, monkeypatch
) -> None:
    def folder(argv: list[str], **env) -> str:
        slurm_task(monkeypatch, argv, **env)
        return run_folder.run_folder(str(tmp_path), "train").name

    assert folder(["model=cnn"], SLURM_STEP_ID="0") == "slurm-4242.0"
    assert folder(["model=cnn"], SLURM_STEP_ID="1") == "slurm-4242.1"  # another srun step
    # Runs started side by side in one step (`python train.py ... &`): a folder each.
    assert folder(["model=lstm"]) == "slurm-4242"
    assert folder(["model=cnn"]) == "slurm-4242-1"
    assert folder(["model=cnn"]) == "slurm-4242-2"
    # The job requeued: each command line takes back a folder it had, with its checkpoints.
    assert folder(["model=cnn"], restart=1) == "slurm-4242-1"
    assert folder(["model=lstm"], restart=1) == "slurm-4242"
    assert folder(["model=cnn"], restart=1) == "slurm-4242-2"
    assert folder(["model=cnn"], restart=1, SLURM_STEP_ID="0") == "slurm-4242.0"
    slurm_task(monkeypatch, [], SLURM_ARRAY_JOB_ID="4200", SLURM_ARRAY_TASK_ID="3")
    assert run_folder.slurm_name() == "slurm-4200_3"


def test_srun_ranks_share_the_folder_rank_0_claims(tmp_path: Path, monkeypatch) -> None:
    tasks = {"SLURM_STEP_ID": "0", "SLURM_NTASKS": "2"}
    slurm_task(monkeypatch, ["trainer.devices=2"], SLURM_PROCID="1", **tasks)
    with pytest.raises(TimeoutError):  # rank 1 waits for rank 0
        run_folder.run_folder(str(tmp_path), "train", timeout_s=0.2)
    slurm_task(monkeypatch, ["trainer.devices=2"], SLURM_PROCID="0", **tasks)
    first = run_folder.run_folder(str(tmp_path), "train")
    slurm_task(monkeypatch, ["trainer.devices=2"], SLURM_PROCID="1", **tasks)
    assert run_folder.run_folder(str(tmp_path), "train") == first
    slurm_task(monkeypatch, ["trainer.devices=2"], SLURM_PROCID="1", restart=1, **tasks)
    with pytest.raises(TimeoutError):  # the requeued job's rank 1 waits for its own rank 0
        run_folder.run_folder(str(tmp_path), "train", timeout_s=0.2)


def composed(*overrides: str):
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base="1.3"):
        cfg = compose("train", overrides=list(overrides), return_hydra_config=True)
    GlobalHydra.instance().clear()
    return cfg


def test_the_composed_config_claims_run_and_sweep_folders(tmp_path: Path, monkeypatch) -> None:
    cfg = composed(f"paths.log_dir={tmp_path}")
    run_dir = Path(OmegaConf.select(cfg, "hydra.run.dir"))
    assert run_dir.parent == tmp_path / "train" / "runs" and run_dir.is_dir()
    assert OmegaConf.select(cfg, "hydra.run.dir") == str(run_dir)  # claimed once
    sweep_dir = Path(OmegaConf.select(cfg, "hydra.sweep.dir"))
    assert sweep_dir.parent == tmp_path / "train" / "multiruns" and sweep_dir.is_dir()

    monkeypatch.setenv("SLURM_JOB_ID", "777")
    new_process(monkeypatch)
    cfg = composed(f"paths.log_dir={tmp_path}", "hydra/launcher=slurm")
    assert OmegaConf.select(cfg, "hydra.run.dir") == str(tmp_path / "train" / "runs" / "slurm-777")
    assert cfg.hydra.launcher._target_.endswith("SlurmLauncher")


TINY = ["data=digits", "trainer=cpu", "debug=limit", "trainer.max_epochs=1", *QUIET]


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


def hold_in_another_process(folder: Path) -> subprocess.Popen:
    """A process that holds `folder`'s lock until it is killed."""
    holder = subprocess.Popen(
        [*PYTHON, "-c", "import sys, time; from kindling.run import folder_lock; "
         "folder_lock.hold(sys.argv[1]); print('held', flush=True); time.sleep(600)", str(folder)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout.readline() == "held\n"
    return holder


def test_a_folder_held_by_a_live_process_is_refused_and_free_once_it_is_killed(
    tmp_path: Path, monkeypatch
) -> None:
    holder = hold_in_another_process(tmp_path)
    try:
        with pytest.raises(UserError, match=rf"{tmp_path} is in use by process {holder.pid} on "):
            folder_lock.hold(tmp_path)
        # The other ranks of the holder's own job share its folder: they take no lock.
        monkeypatch.setattr(rank_zero_only, "rank", 1)
        folder_lock.hold(tmp_path)
        monkeypatch.undo()
        monkeypatch.setenv("NODE_RANK", "1")  # the first process of a second node
        folder_lock.hold(tmp_path)
        monkeypatch.undo()
    finally:
        holder.kill()  # SIGKILL: no chance to clean up
        holder.wait()
    folder_lock.hold(tmp_path)  # the operating system released the lock of the killed process
    folder_lock.release(tmp_path)


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
