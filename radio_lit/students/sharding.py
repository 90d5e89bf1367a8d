"""FSDP2 sharding of the student (DESIGN.md, "Distributed rules")."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def shard_student(student: nn.Module, mesh: Any, mp_policy: Any) -> None:
    """``fully_shard`` each transformer block (``student.blocks``), then the student as the root
    of its own parameters (CPE ViT: grid ``[G * G, D]``, summary tokens, patch embedding, norms;
    E-RADIO: convolutional stages, up/downsampling, norms, summary pooling).

    Every parameter is sharded on dim 0 over ``mesh``; the CPE grid's dim 0 is ``G * G``, so each
    of ``n`` ranks holds ``ceil(G * G / n)`` rows of it.
    """
    from torch.distributed.fsdp import fully_shard

    # FSDP2 shards contiguous parameters only (E-RADIO keeps its convolution weights
    # channels_last; its convolutions then take contiguous weights).
    student.to(memory_format=torch.contiguous_format)
    for block in student.blocks:
        fully_shard(block, mesh=mesh, mp_policy=mp_policy)
    fully_shard(student, mesh=mesh, mp_policy=mp_policy)
