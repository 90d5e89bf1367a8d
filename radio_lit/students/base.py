"""The student contract: what the training step, the heads, grid matching, FSDP2 sharding,
export and evaluation rely on, whatever the architecture (a CPE ViT or E-RADIO)."""

from __future__ import annotations

from dataclasses import dataclass

import torch.export
from torch import Tensor, nn


@dataclass(frozen=True)
class StudentOutput:
    """What the student returns.

    Attributes:
        summary: ``[B, T, D]`` the T summary (CLS) tokens after the final norm.
        features: ``[B, h, w, D]`` patch tokens after the final norm.
    """

    summary: Tensor
    features: Tensor


# A pytree node, so that what traverses a module's output sees its tensors: FSDP2 registers its
# pre-backward hook on the tensors of a sharded module's output (torch <= 2.13 flattens it as a
# pytree: an unregistered dataclass is one opaque leaf, no hook is registered, the gradients are
# never reduce-scattered to the sharded parameters and the optimizer silently updates nothing).
torch.export.register_dataclass(StudentOutput)


class Student(nn.Module):
    """Base class of the students that ``model.student`` takes.

    A student maps normalized images ``[B, 3, H, W]`` (``H``, ``W`` multiples of
    ``patch_size``) to a :class:`StudentOutput` with ``features`` on the ``H / patch_size x
    W / patch_size`` grid, and has these attributes:

    - ``patch_size`` (int): the output stride;
    - ``embed_dim`` (int): ``D``, the width of the summary tokens and features;
    - ``num_cls_tokens`` (int): ``T``, the summary tokens (one shared, one per summary
      teacher, or one per teacher);
    - ``summary_tokens`` (list of teacher names or ``None``): the teacher each summary token
      belongs to, when the layout is declared for every stage of a run
      (:func:`radio_lit.students.heads.summary_token_slots`);
    - ``pixel_mean``, ``pixel_std`` (3-tuples): the input normalization it was built for;
    - ``blocks`` (iterable of modules): the units FSDP2 shards one by one
      (:func:`radio_lit.students.shard_student`).

    and may override :meth:`begin_step`.
    """

    summary_tokens: list[str] | None = None

    def begin_step(self, seed: int, step: int) -> None:
        """Before training step ``step`` of a run seeded ``seed``: the student's per-step
        random choices, drawn from ``(seed, step)`` alone so that every rank makes the same
        (:class:`~radio_lit.students.CPEViT`: ViTDet windows on or off). None by default."""
