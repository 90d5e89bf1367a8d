"""Launching small gloo worker scripts: the tests' way to compare several processes with 1.

The ranks are forked from one ``multiprocessing`` fork server that imported torch, Lightning
and radio-lit once for the whole test session (:data:`PRELOAD`): a launch costs a fork, not
the ~7 CPU seconds of imports that every fresh interpreter pays. The server only imports
(no thread pool, no process group, no tensors computed), so forking it is safe; each rank
starts its own process group and runs its worker's ``main``.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import time
import traceback
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]
#: Imported once by the fork server; every worker's own imports are among these.
PRELOAD = [
    "torch",
    "lightning.pytorch",
    "radio_lit.module",
    "radio_lit.callbacks",
    "tests.builders",
]
TIMEOUT_S = 120

_CONTEXT = multiprocessing.get_context("forkserver")
_CONTEXT.set_forkserver_preload(PRELOAD)


def _rank(module: str, argv: tuple[Any, ...], error_file: str) -> None:
    """One rank: ``module.main(*argv)`` with one thread; a traceback goes to ``error_file``."""
    os.environ.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    try:
        importlib.import_module(module).main(*argv)
    except BaseException:
        Path(error_file).write_text(traceback.format_exc())
        raise


def _module_name(worker: Path) -> str:
    return ".".join(worker.resolve().relative_to(REPO).with_suffix("").parts)


def run_gloo_workers(
    worker: Path,
    tmp_path: Path,
    *args: str,
    world_size: int = 2,
    returncode: int | list[int] = 0,
) -> list[Any]:
    """Run ``main(rank, world_size, init_file, *args, out)`` of the worker script ``worker``
    once per rank, all at once (they meet in ``torch.distributed`` over gloo through the init
    file), and return what each rank saved to its ``out`` with ``torch.save``, in rank order
    (``None`` for a rank that saved nothing).

    Every rank must exit with ``returncode`` (one for all, or one per rank; ``-9``: the rank
    killed itself with SIGKILL)."""
    # The fork server starts at the first launch and inherits this environment.
    paths = [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    codes = [returncode] * world_size if isinstance(returncode, int) else returncode
    tmp_path.mkdir(parents=True, exist_ok=True)
    outputs = [tmp_path / f"rank{rank}.pt" for rank in range(world_size)]
    errors = [tmp_path / f"rank{rank}.err" for rank in range(world_size)]
    init = str(tmp_path / "init")
    module = _module_name(worker)
    processes = [
        _CONTEXT.Process(
            target=_rank, args=(module, (rank, world_size, init, *args, str(out)), str(err))
        )
        for rank, (out, err) in enumerate(zip(outputs, errors, strict=True))
    ]
    for process in processes:
        process.start()
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join()
    for rank, (process, expected, err) in enumerate(zip(processes, codes, errors, strict=True)):
        trace = err.read_text() if err.exists() else "(no traceback)"
        assert process.exitcode == expected, f"rank {rank} exited {process.exitcode}:\n{trace}"
    return [torch.load(out) if out.exists() else None for out in outputs]
