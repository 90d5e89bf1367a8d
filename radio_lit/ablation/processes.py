"""The processes of ``radio-lit ablate``: each row (and the cache write) is a ``radio-lit``
command in a process of its own, forked from a fork server, on its share of the machine.

The fork server is ``multiprocessing``'s ``forkserver``, which has imported torch, Lightning
and radio-lit once (:data:`PRELOAD`; it computes nothing, so forking it is safe): a row costs a
fork, not the seconds of imports a fresh interpreter pays. A row's process runs the command's
function with ``sys.argv`` set to the ``radio-lit`` command it stands for, so Lightning's
launcher starts the other ranks of a multi-device base with that command.

Several rows at once (``--jobs N``) each get a :class:`Slot`: a share of the CPU cores as
torch threads and, on a machine with GPUs, a block of the visible GPUs of its own
(``CUDA_VISIBLE_DEVICES``). A row's numbers depend on its torch thread count (CPU kernels
split their sums by thread), so rows and the cache they train from must be run with the same
``--jobs`` to be bit-identical to each other; any ``--jobs`` trains the same runs otherwise.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["PRELOAD", "Command", "Slot", "job_slots", "start", "visible_gpus"]

#: Imported once by the rows' fork server (a module that is not installed is skipped).
PRELOAD = [
    "torch",
    "lightning.pytorch",
    "open_clip",
    "timm",
    "segment_anything",
    "radio_lit.cli.app",
    "radio_lit.module",
    "radio_lit.teachers",
    "radio_lit.callbacks",
    "radio_lit.ablation",
    "radio_lit.cache.writer",
]


@dataclass
class Command:
    """What a row's process runs: ``function(args)`` (``"module:function"``), the function of
    the ``radio-lit`` command ``args`` (e.g. ``radio_lit.cli.app:main`` for ``fit …``)."""

    function: str
    args: list[str]


@dataclass(frozen=True)
class Slot:
    """What one of the processes running at once may use.

    Attributes:
        threads: torch (and OpenMP) threads, or ``None`` for torch's default (all cores).
        gpus: the ``CUDA_VISIBLE_DEVICES`` value, or ``None`` for every visible GPU.
    """

    threads: int | None = None
    gpus: str | None = None


def visible_gpus() -> list[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them (counted
    without initializing CUDA, so forked processes can still use it)."""
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    if listed is not None:
        return [name for name in (n.strip() for n in listed.split(",")) if name]
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def job_slots(jobs: int, cores: int, gpus: list[str]) -> list[Slot]:
    """``jobs`` slots sharing ``cores`` CPU cores and the GPUs ``gpus`` evenly.

    One job keeps torch's defaults. Several split the cores (at least one thread each) and,
    if there are GPUs, give each job ``len(gpus) // jobs`` of them.

    Raises:
        ValueError: ``jobs`` below 1, or more jobs than GPUs on a machine with GPUs.
    """
    if jobs < 1:
        raise ValueError(f"--jobs must be at least 1, got {jobs}")
    if jobs == 1:
        return [Slot()]
    if gpus and len(gpus) < jobs:
        raise ValueError(
            f"--jobs {jobs} needs a GPU per job but {len(gpus)} are visible "
            f"({','.join(gpus)}): use --jobs {len(gpus)} or fewer"
        )
    threads = max(1, cores // jobs)
    per_job = len(gpus) // jobs
    blocks = [",".join(gpus[k * per_job : (k + 1) * per_job]) for k in range(jobs)]
    return [Slot(threads, blocks[k] if gpus else None) for k in range(jobs)]


def _launcher() -> str:
    """The ``radio-lit`` executable Lightning's launcher restarts a row's other ranks with."""
    found = shutil.which("radio-lit")
    return found if found is not None else os.path.abspath(sys.argv[0])


def _process_main(command: Command, log_path: str, launcher: str, slot: Slot) -> None:
    """A row's process: its output to ``log_path``, its slot's threads and GPUs, then
    ``command`` as ``radio-lit``; the processes it starts import this radio_lit first and
    inherit the slot."""
    multiprocessing.set_start_method(None, force=True)  # its DataLoader workers: the default
    root = str(Path(__file__).resolve().parents[2])
    paths = (root, os.environ.get("PYTHONPATH"))
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    if slot.gpus is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = slot.gpus
    if slot.threads is not None:
        import torch

        os.environ["OMP_NUM_THREADS"] = str(slot.threads)
        torch.set_num_threads(slot.threads)
    log = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    for fd in (1, 2):
        os.dup2(log, fd)
    os.close(log)
    sys.argv = [launcher, *command.args]
    module, name = command.function.split(":")
    getattr(importlib.import_module(module), name)(command.args)


def start(command: Command, log_path: Path, slot: Slot | None = None) -> Any:
    """Fork ``command`` from the fork server on ``slot`` (default: the whole machine);
    returns the started ``multiprocessing`` process."""
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    args = (command, str(log_path), _launcher(), slot or Slot())
    process = context.Process(target=_process_main, args=args)
    process.start()
    return process
