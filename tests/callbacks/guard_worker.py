"""One gloo rank of the guard's agreement test.

Usage: ``python guard_worker.py RANK WORLD INIT OUT``.

Each rank asks :func:`~radio_lit.callbacks.guard.all_ranks_finite` through Lightning's
``DDPStrategy`` twice, first with a NaN on rank 1 only, then with finite values everywhere, and
saves both verdicts.
"""

from __future__ import annotations

import sys
from types import SimpleNamespace

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy

from radio_lit.callbacks.guard import all_ranks_finite


def main(rank: int, world: int, init: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{init}", rank=rank, world_size=world)
    trainer = SimpleNamespace(strategy=DDPStrategy())
    grads = [torch.ones(3), torch.full((2, 2), 0.5)]
    poisoned = [g.clone() for g in grads]
    if rank == 1:
        poisoned[1][0, 1] = float("nan")
    verdicts = [all_ranks_finite(trainer, poisoned), all_ranks_finite(trainer, grads)]
    torch.save(verdicts, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), *sys.argv[3:5])
