"""A real one-node SLURM for the tests: munged, slurmctld and slurmd under a temporary folder.

Everything lives in that folder (config, munge key and socket, spool and state dirs, logs,
pid files); nothing is written to /etc and no system daemon is touched. The node is this
machine with its CPUs (``ProctrackType=proctrack/linuxproc``, ``TaskPlugin=task/none``,
``SelectType=select/cons_tres``). The daemons are stopped by their pids, and so is every
process the jobs left behind (``scancel`` may leave ranks alive).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

#: What a test needs on PATH (Debian: ``apt-get install slurm-wlm munge``).
BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "scontrol", "squeue")


def missing_binaries() -> list[str]:
    return [name for name in BINARIES if shutil.which(name) is None]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _munged() -> str:
    return shutil.which("munged") or "/usr/sbin/munged"


class LocalSlurm:
    """One node, one partition ``debug``, requeue allowed; ``env`` is what a client needs."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.host = socket.gethostname().split(".")[0]
        self.cpus = os.cpu_count() or 1
        self.daemons: list[subprocess.Popen] = []
        self.env = {**os.environ, "SLURM_CONF": str(root / "slurm.conf")}

    # -- set-up ----------------------------------------------------------------------------

    def _write_config(self) -> None:
        for folder in ("state", "spool", "munge", "log"):
            (self.root / folder).mkdir(parents=True, exist_ok=True)
        (self.root / "munge").chmod(0o700)
        key = self.root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        r = self.root
        (r / "slurm.conf").write_text(
            "\n".join(
                [
                    "ClusterName=radiolit",
                    f"SlurmctldHost={self.host}(127.0.0.1)",
                    f"SlurmctldPort={_free_port()}",
                    f"SlurmdPort={_free_port()}",
                    "AuthType=auth/munge",
                    "CredType=cred/munge",
                    f"AuthInfo=socket={r / 'munge' / 'munge.socket'}",
                    "SlurmUser=root",
                    "SlurmdUser=root",
                    f"StateSaveLocation={r / 'state'}",
                    f"SlurmdSpoolDir={r / 'spool'}",
                    f"SlurmctldPidFile={r / 'slurmctld.pid'}",
                    f"SlurmdPidFile={r / 'slurmd.pid'}",
                    f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}",
                    f"SlurmdLogFile={r / 'log' / 'slurmd.log'}",
                    "ProctrackType=proctrack/linuxproc",
                    "TaskPlugin=task/none",
                    "SelectType=select/cons_tres",
                    "SelectTypeParameters=CR_CPU",
                    "JobAcctGatherType=jobacct_gather/none",
                    "AccountingStorageType=accounting_storage/none",
                    "MpiDefault=none",
                    "ReturnToService=2",
                    "SchedulerType=sched/builtin",
                    "JobRequeue=1",
                    "KillWait=30",
                    "InactiveLimit=0",
                    "MinJobAge=600",
                    f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs={self.cpus} State=UNKNOWN",
                    "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP "
                    "OverSubscribe=FORCE:4",
                    "",
                ]
            )
        )

    def start(self) -> LocalSlurm:
        self._write_config()
        r = self.root
        munge = [
            _munged(),
            "--foreground",
            "--force",
            f"--socket={r / 'munge' / 'munge.socket'}",
            f"--key-file={r / 'munge' / 'munge.key'}",
            f"--pid-file={r / 'munge' / 'munged.pid'}",
            f"--log-file={r / 'log' / 'munged.log'}",
            f"--seed-file={r / 'munge' / 'munged.seed'}",
        ]
        self._daemon(munge, "munged")
        self._wait_for(lambda: (r / "munge" / "munge.socket").exists(), "munged")
        self._daemon(["slurmctld", "-D", "-i", "-f", str(r / "slurm.conf")], "slurmctld")
        self._daemon(["slurmd", "-D", "-f", str(r / "slurm.conf")], "slurmd")
        self._wait_for(self._node_idle, "slurmd to register its node")
        return self

    def _daemon(self, argv: list[str], name: str) -> None:
        log = open(self.root / "log" / f"{name}.out", "w")  # noqa: SIM115 (closed with the process)
        self.daemons.append(
            subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        )

    def _wait_for(self, ready, what: str, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            for daemon in self.daemons:
                if daemon.poll() is not None:
                    raise RuntimeError(f"{daemon.args[0]} exited: {self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out waiting for {what}: {self.logs()}")
            time.sleep(0.3)

    def _node_idle(self) -> bool:
        done = self.run(["sinfo", "-h", "-o", "%t"], check=False)
        return done.returncode == 0 and "idle" in done.stdout

    # -- use -------------------------------------------------------------------------------

    def run(self, argv: list[str], check: bool = True) -> subprocess.CompletedProcess:
        done = subprocess.run(argv, env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)}: {done.stderr}")
        return done

    def sbatch(self, script: Path, cwd: Path, args: list[str] = ()) -> str:
        """Submit ``script`` (with ``args`` for it) from ``cwd``; the job id."""
        done = subprocess.run(
            ["sbatch", "--parsable", str(script), *args],
            env=self.env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout.strip().split(";")[0]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` as ``{key: value}`` (empty once the job is forgotten)."""
        done = self.run(["scontrol", "-o", "show", "job", job_id], check=False)
        fields = {}
        for item in done.stdout.split():
            key, _, value = item.partition("=")
            fields[key] = value
        return fields

    def wait_state(self, job_id: str, states: tuple[str, ...], timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while True:
            state = self.job(job_id).get("JobState", "")
            if state in states:
                return state
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} is {state}, not {states}: {self.logs()}")
            time.sleep(1)

    def logs(self) -> str:
        texts = []
        for path in sorted((self.root / "log").glob("*")):
            texts.append(f"--- {path.name}\n{path.read_text(errors='replace')[-2000:]}")
        return "\n".join(texts)

    # -- tear-down -------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop the daemons and every process the jobs left, by pid."""
        children = self._job_processes()
        for daemon in reversed(self.daemons):
            if daemon.poll() is None:
                daemon.terminate()
        for daemon in reversed(self.daemons):
            try:
                daemon.wait(15)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _job_processes(self) -> list[int]:
        """Pids of the processes whose environment points at this cluster's config (job
        steps and everything they started), but not the daemons or this process."""
        own = {os.getpid(), *(d.pid for d in self.daemons)}
        marker = f"SLURM_CONF={self.root / 'slurm.conf'}".encode()
        found = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) in own:
                continue
            try:
                if marker in (entry / "environ").read_bytes().split(b"\0"):
                    found.append(int(entry.name))
            except OSError:
                continue
        return found
