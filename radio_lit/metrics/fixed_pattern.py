"""How much of a teacher's fixed-pattern noise the student reproduces (C-RADIOv4 report 2.3).

A teacher whose features carry a pattern ``P [H, W, C]`` locked to its token grid
(:class:`~radio_lit.teachers.FixedPatternTeacher`: ``y = y_clean + P``) teaches it to a student
trained with plain MSE. Given the student's estimate ``x [B, H, W, C]`` in the teacher's space
and the teacher's *clean* features ``y_clean`` for the same unshifted images:

- ``pattern_share = <R, P> / <P, P>``, with ``R [H, W, C] = mean_images(x - y_clean)`` the
  student's mean residual per token (the position-locked part of its error; sums over tokens
  and channels): 1 when the whole pattern is copied, 0 when none of it is;
- ``clean_mse = mean((x - y_clean)^2)`` over images, tokens and channels: the student's error
  against what the teacher sees in the image, in the teacher's space (PHI-S table 3's space).

The sums are float64 states reduced by torchmetrics across ranks, so the values over a
validation set do not depend on its batching or the number of processes.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torchmetrics import Metric

__all__ = ["PatternShare"]

_F64 = torch.float64


class PatternShare(Metric):
    """``pattern_share`` and ``clean_mse`` (module docstring) of one teacher's pattern.

    Args:
        pattern: the teacher's pattern ``P [H, W, C]`` on the grid the estimates are given on.
    """

    full_state_update = False

    def __init__(self, pattern: Tensor) -> None:
        super().__init__()
        if pattern.ndim != 3 or not bool(pattern.any()):
            raise ValueError(
                f"pattern must be a non-zero [H, W, C] map, got shape {tuple(pattern.shape)}"
            )
        self.register_buffer("pattern", pattern.detach().to(_F64), persistent=False)
        zeros = torch.zeros(pattern.shape, dtype=_F64)
        self.add_state("residual_sum", zeros, dist_reduce_fx="sum")
        self.add_state("images", torch.zeros((), dtype=_F64), dist_reduce_fx="sum")
        self.add_state("squared_error", torch.zeros((), dtype=_F64), dist_reduce_fx="sum")
        self.add_state("elements", torch.zeros((), dtype=_F64), dist_reduce_fx="sum")

    def update(self, estimate: Tensor, clean: Tensor) -> None:
        """Add a batch: the student's ``estimate`` and the teacher's ``clean`` features, both
        ``[B, H, W, C]`` in the teacher's space on the pattern's grid."""
        if estimate.shape != clean.shape or estimate.shape[1:] != self.pattern.shape:
            raise ValueError(
                f"estimate {tuple(estimate.shape)} and clean {tuple(clean.shape)} must both be "
                f"[B, *{tuple(self.pattern.shape)}]"
            )
        error = estimate.detach().to(_F64) - clean.detach().to(_F64)
        self.residual_sum += error.sum(0)
        self.images += error.shape[0]
        self.squared_error += error.square().sum()
        self.elements += error.numel()

    def compute(self) -> dict[str, Tensor]:
        """``{"pattern_share": scalar, "clean_mse": scalar}`` over everything added."""
        residual = self.residual_sum / self.images
        share = (residual * self.pattern).sum() / self.pattern.square().sum()
        return {"pattern_share": share, "clean_mse": self.squared_error / self.elements}
