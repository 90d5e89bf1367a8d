"""FSDP2 sharding of the student (DESIGN.md, "Distributed rules")."""

from __future__ import annotations

from typing import Any

from radio_lit.students.cpe_vit import CPEViT


def shard_student(student: CPEViT, mesh: Any, mp_policy: Any) -> None:
    """``fully_shard`` each transformer block, then the student as the root of its own
    parameters (CPE grid ``[G * G, D]``, summary tokens, patch embedding, norms).

    Every parameter is sharded on dim 0 over ``mesh``; the CPE grid's dim 0 is ``G * G``, so each
    of ``n`` ranks holds ``ceil(G * G / n)`` rows of it.
    """
    from torch.distributed.fsdp import fully_shard

    for block in student.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp_policy)
    fully_shard(student, mesh=mesh, mp_policy=mp_policy)
