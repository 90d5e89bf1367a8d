"""What a run learns from the scheduler that started it: SLURM or torchrun (TorchElastic).

Lightning picks its cluster environment from the same variables
(:class:`~lightning.fabric.plugins.environments.SLURMEnvironment`,
:class:`~lightning.fabric.plugins.environments.TorchElasticEnvironment`); this module adds what
radio-lit needs beside it: the allocation's process count, checked against the config before
any teacher is built (:func:`check_allocation`), the job's id, requeueing it (:func:`requeue`),
and the process's stop signals (:data:`STOP`): from the start of ``radio-lit fit`` a signal
stops the build at once (:class:`~radio_lit.core.errors.BuildInterrupted`, :func:`stop_building`);
once training is set up, :class:`~radio_lit.callbacks.Preemption` acts on it at a step boundary.

This module imports nothing heavy (no torch, no Lightning at import), so that ``radio-lit``
takes the signals before the seconds of imports (:mod:`radio_lit.__main__`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Mapping
from types import FrameType
from typing import Any

from radio_lit.core.errors import BuildInterrupted, ConfigError

#: The signals that stop a run: SLURM's warning, the scheduler's (or ``kill``'s) end, Ctrl-C.
STOP_SIGNALS = (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT)


def under_slurm() -> bool:
    """Whether this process is a task that ``srun`` started (not an interactive allocation):
    Lightning's :meth:`SLURMEnvironment.detect`, without its warning on machines with ``srun``."""
    interactive = os.environ.get("SLURM_JOB_NAME") in ("bash", "interactive")
    return "SLURM_NTASKS" in os.environ and not interactive


def slurm_job_id() -> str | None:
    """The SLURM job's id (``<array job>_<task>`` for an array task); None outside SLURM. A
    requeued job keeps its id."""
    if not under_slurm():
        return None
    array_job, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    if array_job and task:
        return f"{array_job}_{task}"
    return os.environ.get("SLURM_JOB_ID")


def requeue(job_id: str) -> str | None:
    """``scontrol requeue job_id``; None when SLURM took it, else SLURM's reason (one line).

    SLURM then ends the running job (SIGTERM to every process of the job, then SIGKILL after
    its ``KillWait``) and starts it again, with the same id and ``SLURM_RESTART_COUNT`` one
    higher, when resources allow. When several ranks ask at once, the first request's SIGTERM
    can kill another rank's ``scontrol`` before it answers: a ``scontrol`` ended by a signal
    is asked once more, and a job already requeued then answers "pending execution".
    """
    for _ in range(2):
        try:
            done = subprocess.run(
                ["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return str(error)
        if done.returncode >= 0:
            break
    if done.returncode == 0:
        return None
    if "pending execution" in done.stderr:  # another rank of this running job requeued it
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    if lines:
        return lines[-1]
    if done.returncode < 0:
        return f"scontrol was ended by signal {-done.returncode}, twice"
    return f"scontrol exited {done.returncode}"


def allocated_processes() -> tuple[int, str] | None:
    """``(number of processes, where it comes from)`` that the scheduler started for this
    run: SLURM's ``SLURM_NTASKS`` or torchrun's ``WORLD_SIZE``; None when started by hand
    (Lightning then launches the processes itself)."""
    from lightning.fabric.plugins.environments import TorchElasticEnvironment

    if under_slurm():
        return int(os.environ["SLURM_NTASKS"]), "SLURM_NTASKS"
    if TorchElasticEnvironment.detect():
        return int(os.environ["WORLD_SIZE"]), "WORLD_SIZE (torchrun)"
    return None


def configured_processes(trainer: Mapping[str, Any]) -> tuple[int, str] | None:
    """``(trainer.devices x trainer.num_nodes, how it reads)`` for a config's ``trainer``
    section; None when ``devices`` is left to Lightning (``auto``, ``-1``)."""
    devices = trainer.get("devices", "auto")
    nodes = int(trainer.get("num_nodes", 1) or 1)
    if isinstance(devices, (list, tuple)):
        count = len(devices)
    elif isinstance(devices, str) and "," in devices:
        count = len([d for d in devices.split(",") if d.strip()])
    else:
        try:
            count = int(devices)
        except (TypeError, ValueError):
            return None
        if count < 0:
            return None
    return count * nodes, f"trainer.devices x trainer.num_nodes = {devices} x {nodes}"


def check_allocation(trainer: Mapping[str, Any]) -> None:
    """Refuse a ``trainer`` section that does not use the processes the scheduler started.

    Each process SLURM (``srun``) or torchrun starts is one rank of one run; a config with
    fewer ranks makes each process train alone: ``torchrun --nproc_per_node 2`` with
    ``devices: 1`` trains two identical, independent runs, writing into the same folder.
    """
    allocated = allocated_processes()
    configured = configured_processes(trainer)
    if allocated is None or configured is None or allocated[0] == configured[0]:
        return
    (given, source), (wanted, reads) = allocated, configured
    raise ConfigError(
        f"trainer.devices: the scheduler started {given} processes ({source}) but {reads} "
        f"= {wanted}: give --trainer.devices <processes per node> and --trainer.num_nodes "
        f"<nodes> so that their product is {given} (docs/clusters.md)"
    )


def worker_ignores_stop_signals(worker_id: int) -> None:
    """DataLoader ``worker_init_fn``: a worker outlives the stop signals meant for its rank.

    SLURM signals every process of a job step, DataLoader workers included (its warning
    ``USR1``, and ``SIGTERM`` on preemption or at the time limit), and Ctrl-C reaches the whole
    foreground process group: a worker that died of the signal would fail the step that the
    main process is finishing before it saves (:class:`radio_lit.callbacks.Preemption`). So a
    worker ignores ``USR1`` and Ctrl-C, and its first ``SIGTERM``; a second ``SIGTERM`` ends
    it, which is how the main process (the DataLoader's shutdown, then ``multiprocessing`` at
    exit) ends a worker that does not stop when asked. A worker whose main process is gone
    stops by itself (the DataLoader's watchdog).
    """
    for signum in (signal.SIGUSR1, signal.SIGINT):
        signal.signal(signum, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _default_sigterm_from_now_on)


def _default_sigterm_from_now_on(signum: int, frame: object) -> None:
    """A worker's first ``SIGTERM``: ignored, and the next one gets the default (death)."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


class StopSignals:
    """Where this process's stop signals (:data:`STOP_SIGNALS`) go; one per process: :data:`STOP`.

    While ``raising`` (``radio-lit fit`` building its run: imports, teachers, student, data,
    trainer), the first signal raises :class:`~radio_lit.core.errors.BuildInterrupted` from the
    handler, as Ctrl-C raises ``KeyboardInterrupt``, so that a build of minutes (a 7B
    teacher) stops at once: nothing was trained, nothing needs saving. Otherwise the handler
    only records the signal (:attr:`received`), and :class:`~radio_lit.callbacks.Preemption`
    acts on it at the next step boundary, where every rank can take part in a save. After a
    first Ctrl-C, a second one gets the handler that was there before (it interrupts at once).
    """

    def __init__(self) -> None:
        self.received = 0  #: the last stop signal received (0: none)
        self.raising = False
        self._previous: dict[int, Any] = {}

    def install(self, raising: bool) -> bool:
        """Take the stop signals (again, from whoever took them since) and set :attr:`raising`;
        whether this call installed the handler (False: it was already installed, and whoever
        installed it uninstalls it)."""
        self.raising = raising
        if self._previous:
            self.take_back()
            return False
        self.received = 0
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._handle)
        return True

    def take_back(self) -> None:
        """Take the signals back from handlers registered since :meth:`install` (Lightning
        registers its own when training starts); a Ctrl-C already received leaves SIGINT to
        the handler that interrupts at once."""
        for signum in STOP_SIGNALS:
            if not (signum == signal.SIGINT and self.received == signal.SIGINT):
                signal.signal(signum, self._handle)

    def uninstall(self) -> None:
        """Give the signals back to the handlers they had before :meth:`install`."""
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}
        self.raising = False

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self.received = signum
        if signum == signal.SIGINT:  # a second Ctrl-C interrupts at once
            signal.signal(signum, self._previous.get(signum, signal.default_int_handler))
        if self.raising:
            self.raising = False  # raised once: the stop that follows is not interrupted
            raise BuildInterrupted(signum)


#: This process's stop signals.
STOP = StopSignals()


def launch_rank() -> int:
    """This process's rank as its launcher numbered it (SLURM's ``SLURM_PROCID``,
    torchrun's ``RANK``, Lightning's ``LOCAL_RANK`` for the processes it starts); 0 when
    started alone. Known before the ranks have a process group."""
    if under_slurm():
        return int(os.environ.get("SLURM_PROCID", "0") or 0)
    for variable in ("RANK", "LOCAL_RANK"):
        if os.environ.get(variable, "").isdigit():
            return int(os.environ[variable])
    return 0


def stop_building(signum: int) -> int:
    """After a stop signal ended the build of a run
    (:class:`~radio_lit.core.errors.BuildInterrupted`):
    under SLURM requeue the job (every rank that received the signal asks; nothing to save:
    the requeued job starts from its run folder's newest checkpoint, if any); rank 0 says so
    in one line. Returns the exit status, 128 + the signal (130 for Ctrl-C, 143 for SIGTERM).
    """
    name = signal.Signals(signum).name
    line = (
        f"radio-lit: {name} received while the run was being built (before its first step): "
        "nothing was trained or saved"
    )
    job = slurm_job_id()
    if job is None:
        line += "; run the same command again to start it"
    else:
        refused = requeue(job)
        line += (
            f"; SLURM job {job} requeued: it starts again in its run folder (from the newest "
            "checkpoint there, if any)"
            if refused is None
            else f"; SLURM did not requeue job {job}: {refused}"
        )
    if launch_rank() == 0:
        print(line, file=sys.stderr, flush=True)
    return 128 + signum
