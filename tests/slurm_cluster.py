"""A SLURM cluster for the tests: a throwaway one-node cluster, or your own.

`slurm_cluster` (session fixture) starts munged, slurmctld and slurmd in the foreground, with
their config, state and logs in a temporary folder (no systemd, nothing in /etc), waits for the
node to be idle, and at the end cancels what is left of the jobs and stops the three daemons by
process id. It needs root and Debian's `slurm-wlm` and `munge` (`.ci/run` installs them in CI);
elsewhere the SLURM tests are skipped with one line (in CI they fail instead).

Your own cluster: `KINDLING_SLURM_PARTITION=<partition> pytest -m slow tests/test_slurm.py
--basetemp=<a folder every node reads>` submits the same jobs there, with `sbatch` as your
login node has it configured.
"""

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from helpers import free_port

COMMANDS = ("munged", "slurmctld", "slurmd", "sbatch", "srun")


@dataclass(frozen=True)
class Cluster:
    partition: str
    env: dict[str, str]  # the environment of `sbatch`, `srun` and `python train.py -m ...`

    def launcher(self, *overrides: str) -> list[str]:
        """`python train.py` overrides that submit through submitit to this cluster."""
        return [
            "hydra/launcher=slurm",
            f"hydra.launcher.partition={self.partition}",
            "hydra.launcher.cpus_per_task=1",
            "hydra.launcher.mem_gb=1",
            *overrides,
        ]

    def run(self, *command: str, timeout: float = 60) -> str:
        """A SLURM command (`srun ...`, `squeue ...`) on this cluster; its output."""
        return subprocess.run(
            command, env=self.env, capture_output=True, text=True, check=True, timeout=timeout
        ).stdout


def slurm_conf(folder: Path, node: str) -> str:
    return f"""\
ClusterName=kindling-tests
SlurmctldHost={node}
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
# A requeued job starts 5 s after its credential expires, not 120 s; the scheduler runs each second.
AuthInfo=socket={folder}/munge.socket,cred_expire=5
SchedulerParameters=sched_interval=1,bf_interval=1
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
ReturnToService=2
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
# 4 CPUs whatever the machine, so the tests' jobs run side by side (slurmd takes them as given).
SlurmdParameters=config_overrides
NodeName={node} CPUs=4 RealMemory=8192 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def configure(folder: Path) -> Cluster:
    """Config, key and state folders of a one-node cluster in `folder`."""
    node = socket.gethostname().split(".")[0]  # slurmd finds its NodeName from `hostname -s`
    for sub in ("state", "spool"):
        (folder / sub).mkdir()
    key = folder / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    (folder / "slurm.conf").write_text(slurm_conf(folder, node))
    (folder / "bin").mkdir()
    sacct = folder / "bin" / "sacct"
    sacct.write_text(f"#!{sys.executable}\n{SACCT}")
    sacct.chmod(0o755)
    env = {
        **os.environ,
        "SLURM_CONF": str(folder / "slurm.conf"),
        "PATH": f"{folder / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        # One thread per task: SLURM gives each one CPU, and task/none does not pin it there.
        "OMP_NUM_THREADS": "1",
    }
    return Cluster("debug", env)


# `sacct -o JobID,State,NodeList --parsable2 -j <id> ...` as submitit asks it, answered from
# what `scontrol` holds of recent jobs (MinJobAge, 300 s): this cluster keeps no accounting
# (slurmdbd), and without it submitit never learns that a job was cancelled.
SACCT = """
import subprocess, sys

print("JobID|State|NodeList")
ids = [sys.argv[i + 1] for i, arg in enumerate(sys.argv[:-1]) if arg == "-j"]
for job in ids:
    shown = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True)
    for line in shown.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        task = fields.get("ArrayTaskId")
        name = f"{fields['ArrayJobId']}_{task}" if task else fields["JobId"]
        print(f"{name}|{fields['JobState']}|{fields.get('NodeList', '')}")
"""


def start(cluster: Cluster, folder: Path, daemons: list[subprocess.Popen]) -> None:
    """munged, slurmctld and slurmd, each in the foreground (its process is the daemon, stopped
    by its id), appended to `daemons` as they start; returns once the node is idle."""
    munged = [
        "munged", "--foreground", "--force", f"--socket={folder}/munge.socket",
        f"--key-file={folder}/munge.key", f"--pid-file={folder}/munged.pid",
        f"--seed-file={folder}/munged.seed", f"--log-file={folder}/munged.log",
    ]  # fmt: skip
    for command in (munged, ["slurmctld", "-D", "-i"], ["slurmd", "-D"]):
        with open(folder / f"{command[0]}.out", "w") as out:
            daemons.append(subprocess.Popen(command, env=cluster.env, stdout=out, stderr=out))
        if command[0] == "munged":
            wait_for(lambda: (folder / "munge.socket").exists(), "munged's socket", folder)
    wait_for(lambda: _node_state(cluster) == "idle", "idle node", folder)


def _node_state(cluster: Cluster) -> str:
    try:
        return cluster.run("sinfo", "--noheader", "--Node", "--format=%t", timeout=5).strip()
    except subprocess.SubprocessError:  # slurmctld not listening yet
        return ""


def wait_for(ready: Callable[[], bool], what: str, logs: Path, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not ready():
        if time.monotonic() > deadline:
            said = "\n".join(p.read_text()[-2000:] for p in sorted(logs.glob("*.out")))
            raise TimeoutError(f"no {what} after {timeout_s} s; the daemons said:\n{said}")
        time.sleep(0.2)


def stop(cluster: Cluster, folder: Path, daemons: list[subprocess.Popen]) -> None:
    """Cancel the jobs left (their processes are slurmd's), then stop each daemon, last first."""
    try:
        if len(daemons) == 3:
            cluster.run("scancel", f"--user={os.getuid()}", timeout=10)
            wait_for(lambda: not cluster.run("squeue", "--noheader").strip(), "empty queue", folder)
    finally:
        for daemon in reversed(daemons):
            daemon.terminate()
            try:
                daemon.wait(timeout=15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    partition = os.environ.get("KINDLING_SLURM_PARTITION")
    if partition:  # your own cluster, as `sbatch` on this machine reaches it
        yield Cluster(partition, dict(os.environ))
        return
    missing = [name for name in COMMANDS if shutil.which(name) is None]
    if missing or os.geteuid() != 0:
        why = f"missing {', '.join(missing)}" if missing else "not root"
        reason = f"no SLURM cluster for the tests ({why}): apt-get install slurm-wlm munge as root"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    folder = tmp_path_factory.mktemp("slurm")
    cluster = configure(folder)
    daemons: list[subprocess.Popen] = []
    try:
        start(cluster, folder, daemons)
        yield cluster
    finally:
        stop(cluster, folder, daemons)
