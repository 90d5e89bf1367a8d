"""FSDP2 sharding of the student (DESIGN.md, "Distributed rules") and its settings
(``model.fsdp2``: :class:`FSDP2`)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from radio_lit.students.base import Student
from radio_lit.students.heads import TeacherHeads

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class FSDP2:
    """How FSDP2 shards the student under ``ModelParallelStrategy`` (``model.fsdp2``).

    Every parameter is sharded on dim 0 over the data-parallel ranks whatever the settings;
    they choose when the full weights exist (memory) against how many operations and
    collectives a step dispatches:

    Args:
        layout: the student's FSDP2 units. ``"student"``: one unit, the whole student gathered
            once per step (one all-gather before its forward, kept through the backward, one
            reduce-scatter after it): σReparam computes every layer's effective weight of the
            step together (:func:`~radio_lit.students.spectral_reparam.spectral_step`), at the
            cost of the student's full weights (compute dtype) and gradients on every rank
            during the step (ViT-L/16: 0.6 GB of bf16 weights, 0.6 GB of gradients, plus their
            float32 copy while reduced). ``"blocks"``: each transformer block its own unit,
            gathered as it runs (ZeRO-3, the least memory), so σReparam computes each layer's
            weight as the layer runs (~4x the student forward's operations at ViT-L:
            ``benchmarks/student_ops.py``). ``[choice]`` ``"student"``: a ViT-L to ViT-g
            student's weights are small beside its teachers and activations.
        reshard_after_forward: ``"blocks"`` only: free each block's gathered weights after its
            forward and gather them again for its backward (ZeRO-3; ``False``: keep them from
            forward to backward, ZeRO-2-like: no second all-gather, the full student's weights
            in memory at the end of the forward). The student itself, FSDP2's root, always
            keeps its own gathered weights from forward to backward.
        prefetch: ``"blocks"`` only: how many next blocks each block's all-gather is issued
            ahead of, in forward and backward (1: FSDP2's own overlap of one block; more:
            more overlap, that many more blocks' weights in memory).
        reduce_dtype: the dtype of the gradients' reduce-scatter (``"float32"``: exact
            averaging under bf16 parameters; ``"bfloat16"``: half the traffic).

    Under ``bf16`` precision the gathered weights (and the forward's compute) are bfloat16,
    the sharded weights and the optimizer's state stay float32.
    """

    layout: Literal["student", "blocks"] = "student"
    reshard_after_forward: bool = True
    prefetch: int = 1
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"

    def __post_init__(self) -> None:
        if self.layout not in ("student", "blocks"):
            raise ValueError(
                f"model.fsdp2.layout must be 'student' or 'blocks', got {self.layout!r}"
            )
        if self.prefetch < 1:
            raise ValueError(
                f"model.fsdp2.prefetch must be >= 1 (blocks gathered ahead), got {self.prefetch}"
            )
        if self.reduce_dtype not in _DTYPES:
            raise ValueError(
                "model.fsdp2.reduce_dtype must be 'float32' or 'bfloat16', "
                f"got {self.reduce_dtype!r}"
            )

    def policy(self, bf16: bool) -> Any:
        """The ``MixedPrecisionPolicy``: bfloat16 gathered weights under ``bf16``."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        param_dtype = torch.bfloat16 if bf16 else None
        return MixedPrecisionPolicy(
            param_dtype=param_dtype, reduce_dtype=_DTYPES[self.reduce_dtype]
        )


DEFAULT_FSDP2 = FSDP2()
"""``model.fsdp2``'s default: the student one unit, ZeRO-3 blocks if any, float32 reduce."""


def shard_student(
    student: nn.Module, mesh: Any, mp_policy: Any, settings: FSDP2 = DEFAULT_FSDP2
) -> None:
    """``fully_shard`` the student by ``settings.layout`` (:class:`FSDP2`): ``"blocks"`` makes
    each transformer block (``student.blocks``) a unit first; the student is the root unit of
    its remaining parameters (CPE ViT: grid ``[G * G, D]``, summary tokens, patch embedding,
    norms; E-RADIO: convolutional stages, up/downsampling, norms, summary pooling), of all of
    them under ``"student"``.

    Every parameter is sharded on dim 0 over ``mesh``; the CPE grid's dim 0 is ``G * G``, so each
    of ``n`` ranks holds ``ceil(G * G / n)`` rows of it.
    """
    from torch.distributed.fsdp import fully_shard

    # FSDP2 shards contiguous parameters only (E-RADIO keeps its convolution weights
    # channels_last; its convolutions then take contiguous weights).
    student.to(memory_format=torch.contiguous_format)
    if settings.layout == "blocks":
        blocks = [
            fully_shard(
                block,
                mesh=mesh,
                mp_policy=mp_policy,
                reshard_after_forward=settings.reshard_after_forward,
            )
            for block in student.blocks
        ]
        if settings.prefetch > 1:
            for i, block in enumerate(blocks):
                block.set_modules_to_forward_prefetch(blocks[i + 1 : i + 1 + settings.prefetch])
                block.set_modules_to_backward_prefetch(
                    blocks[max(0, i - settings.prefetch) : i][::-1]
                )
    fully_shard(student, mesh=mesh, mp_policy=mp_policy)


def shard_for_training(
    student: Student,
    heads: Iterable[TeacherHeads],
    extra: nn.Module,
    mesh: Any,
    bf16: bool,
    settings: FSDP2 = DEFAULT_FSDP2,
) -> None:
    """``fully_shard`` the student (:func:`shard_student`), every adaptor head and, if it has
    parameters (a learned loss balance), ``extra``; teachers are never passed here.

    Parameters are gathered in bfloat16 under ``bf16`` mixed precision, gradients reduced in
    ``settings.reduce_dtype`` (:class:`FSDP2`); ``extra`` stays float32. Each head is a root
    unit of its own (gathered from its forward to its backward). Normalizer statistics are
    buffers outside every policy.
    """
    from torch.distributed.fsdp import fully_shard

    policy = settings.policy(bf16)
    shard_student(student, mesh, policy, settings)
    for pair in heads:
        for head in (pair.features, pair.summary):
            if head is not None:
                fully_shard(head, mesh=mesh, mp_policy=policy)
    if any(True for _ in extra.parameters()):
        fully_shard(extra, mesh=mesh)  # float32, gradients reduced over ranks


def shard_module(
    student: Student,
    heads: Mapping[str, TeacherHeads],
    balancer: nn.Module,
    ema: Any,
    mesh: Any,
    precision: str,
    settings: FSDP2 = DEFAULT_FSDP2,
) -> None:
    """``DistillationModule.configure_model`` under ``ModelParallelStrategy``: the student,
    heads and (learned) balancer by :func:`shard_for_training` (bf16 gathered weights under a
    ``bf16`` Lightning ``precision``), then the EMA student and heads
    (:class:`~radio_lit.students.ema.EMAStudent`, or ``None``) sharded alike, so that its
    update pairs each shard with the live student's same shard."""
    bf16 = precision.startswith("bf16")
    shard_for_training(student, heads.values(), balancer, mesh, bf16, settings)
    if ema is not None:
        shard_for_training(ema.student, ema.heads.values(), nn.Module(), mesh, bf16, settings)
