"""What a run learns from the scheduler that started it: SLURM or torchrun (TorchElastic).

Lightning picks its cluster environment from the same variables
(:class:`~lightning.fabric.plugins.environments.SLURMEnvironment`,
:class:`~lightning.fabric.plugins.environments.TorchElasticEnvironment`); this module adds what
radio-lit needs beside it: the allocation's process count, checked against the config before
any teacher is built (:func:`check_allocation`), the job's id, and requeueing it
(:func:`requeue`).
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Mapping
from typing import Any

from lightning.fabric.plugins.environments import TorchElasticEnvironment

from radio_lit.errors import ConfigError

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

    SLURM then ends the running job (SIGTERM, then SIGKILL after its ``KillWait``) and starts
    it again, with the same id and ``SLURM_RESTART_COUNT`` one higher, when resources allow.
    """
    try:
        done = subprocess.run(
            ["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return str(error)
    if done.returncode == 0:
        return None
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[-1] if lines else f"scontrol exited {done.returncode}"


def allocated_processes() -> tuple[int, str] | None:
    """``(number of processes, where it comes from)`` that the scheduler started for this
    run: SLURM's ``SLURM_NTASKS`` or torchrun's ``WORLD_SIZE``; None when started by hand
    (Lightning then launches the processes itself)."""
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
        f"<nodes> so that their product is {given} (README: On a cluster)"
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
