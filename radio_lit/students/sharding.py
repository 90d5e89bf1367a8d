"""FSDP2 sharding of the student (DESIGN.md, "Distributed rules")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from radio_lit.students.base import Student
from radio_lit.students.heads import TeacherHeads


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


def shard_for_training(
    student: Student,
    heads: Iterable[TeacherHeads],
    extra: nn.Module,
    mesh: Any,
    bf16: bool,
) -> None:
    """``fully_shard`` the student (:func:`shard_student`), every adaptor head and, if it has
    parameters (a learned loss balance), ``extra``; teachers are never passed here.

    Parameters are gathered in bfloat16 under ``bf16`` mixed precision, gradients reduced in
    float32; ``extra`` stays float32. Normalizer statistics are buffers outside every policy.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    policy = MixedPrecisionPolicy(
        param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32
    )
    shard_student(student, mesh, policy)
    for pair in heads:
        for head in (pair.features, pair.summary):
            if head is not None:
                fully_shard(head, mesh=mesh, mp_policy=policy)
    if any(True for _ in extra.parameters()):
        fully_shard(extra, mesh=mesh)  # float32, gradients reduced over ranks
