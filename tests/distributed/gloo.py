"""Launching small gloo worker scripts: the tests' way to compare 2 processes with 1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

REPO = Path(__file__).resolve().parents[2]


def run_gloo_workers(
    worker: Path, tmp_path: Path, *args: str, world_size: int = 2, returncode: int = 0
) -> list[Any]:
    """Run ``python worker <rank> <world_size> <init file> *args <out>`` once per rank, all at
    once (they meet in ``torch.distributed`` over gloo through the init file), and return what
    each rank saved to its ``out`` with ``torch.save``, in rank order.

    Every rank must exit with ``returncode`` (e.g. ``-9``: each killed itself with SIGKILL,
    and nothing is returned)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    outputs = [tmp_path / f"rank{rank}.pt" for rank in range(world_size)]
    init = str(tmp_path / "init")
    workers = [
        subprocess.Popen(
            [sys.executable, str(worker), str(rank), str(world_size), init, *args, str(out)],
            env=env,
            cwd=REPO,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank, out in enumerate(outputs)
    ]
    for rank, process in enumerate(workers):
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == returncode, (
            f"rank {rank} exited {process.returncode}:\n{stderr}"
        )
    return [torch.load(out) for out in outputs] if returncode == 0 else []
