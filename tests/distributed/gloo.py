"""Launching small gloo worker scripts: the tests' way to compare several processes with 1.

The ranks are forked from the tests' fork server (:mod:`tests.forking`: torch, Lightning and
radio-lit imported once per session), so a launch costs a fork, not an interpreter start.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from tests.forking import REPO, start

TIMEOUT_S = 120


def join_gloo(rank: int, world_size: int, init_file: str) -> None:
    """In a worker of :func:`run_gloo_workers`: this rank's environment as a launcher sets it
    (Lightning then launches nothing) and its gloo process group, met through ``init_file``."""
    from datetime import timedelta

    import torch.distributed as dist

    os.environ.update(LOCAL_RANK=str(rank), NODE_RANK="0", WORLD_SIZE=str(world_size))
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=world_size,
        timeout=timedelta(seconds=60),
    )


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
    codes = [returncode] * world_size if isinstance(returncode, int) else returncode
    module = ".".join(worker.resolve().relative_to(REPO).with_suffix("").parts)
    outputs = [tmp_path / f"rank{rank}.pt" for rank in range(world_size)]
    init = str(tmp_path / "init")
    ranks = [
        start(
            f"{module}:main",
            (rank, world_size, init, *args, str(out)),
            tmp_path / f"rank{rank}",
            env={**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"},
        )
        for rank, out in enumerate(outputs)
    ]
    deadline = time.monotonic() + TIMEOUT_S
    ended = [rank.wait(deadline) for rank in ranks]
    for rank, (outcome, expected) in enumerate(zip(ended, codes, strict=True)):
        assert outcome.exitcode == expected, (
            f"rank {rank} exited {outcome.exitcode}:\n{outcome.stderr[-5000:]}"
        )
    return [torch.load(out) if out.exists() else None for out in outputs]
