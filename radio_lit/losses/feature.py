"""Feature-matching losses (PHI-S section 2.1, eqs. 1-4; AM-RADIO section 3.4, eqs. 2-3).

Every loss maps a prediction and a target of the same shape ``[B, ..., C]`` to a scalar. The
cosine term is taken along the last (channel) dimension and averaged over all other positions.
With ``per_sample=True`` a loss returns one value per image instead, ``[B]`` (the mean over
that image's positions and channels), for balancers that weigh images separately
(:class:`~radio_lit.losses.TeacherDropping`); their mean is the scalar loss.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def _float(tensor: Tensor) -> Tensor:
    """``tensor`` in float32 (losses are computed in it), cast only if it is not."""
    return tensor if tensor.dtype == torch.float32 else tensor.float()


def _check_shapes(pred: Tensor, target: Tensor) -> None:
    if pred.shape != target.shape:
        raise ValueError(
            f"loss inputs differ in shape: prediction {tuple(pred.shape)} vs target "
            f"{tuple(target.shape)}; the adaptor head's output width must equal the teacher's "
            "channel count and the student map must be resized to the teacher's grid"
        )


def _per_sample_mean(values: Tensor) -> Tensor:
    """``[B, ...]`` -> ``[B]``: the mean over everything but the first dim."""
    return values.reshape(values.shape[0], -1).mean(1)


class Loss(nn.Module):
    """A loss ``loss(pred, target, per_sample=False)``: a scalar, or ``[B]`` per image."""

    def forward(self, pred: Tensor, target: Tensor, per_sample: bool = False) -> Tensor:
        raise NotImplementedError


class MSE(Loss):
    """Mean squared error over all elements (eq. 1): the PHI-S baseline."""

    def forward(self, pred: Tensor, target: Tensor, per_sample: bool = False) -> Tensor:
        _check_shapes(pred, target)
        if per_sample:
            return _per_sample_mean(F.mse_loss(_float(pred), _float(target), reduction="none"))
        return F.mse_loss(_float(pred), _float(target))


class Cosine(Loss):
    """Cosine distance ``1 - cos(x, y)`` along the last dim, averaged (eq. 2).

    AM-RADIO's summary loss (eq. 2 of that paper).
    """

    def forward(self, pred: Tensor, target: Tensor, per_sample: bool = False) -> Tensor:
        _check_shapes(pred, target)
        distance = 1.0 - F.cosine_similarity(_float(pred), _float(target), dim=-1)
        return _per_sample_mean(distance) if per_sample else distance.mean()


class _Hybrid(Loss):
    """``beta * cosine + (1 - beta) * magnitude_loss`` (eqs. 3-4)."""

    def __init__(self, magnitude: Loss, beta: float) -> None:
        super().__init__()
        if not 0.0 <= beta <= 1.0:
            raise ValueError(f"beta must lie in [0, 1], got {beta}")
        self.beta = beta
        self.cosine = Cosine()
        self.magnitude = magnitude

    def forward(self, pred: Tensor, target: Tensor, per_sample: bool = False) -> Tensor:
        return self.beta * self.cosine(pred, target, per_sample) + (
            1.0 - self.beta
        ) * self.magnitude(pred, target, per_sample)


class _SmoothL1(Loss):
    def forward(self, pred: Tensor, target: Tensor, per_sample: bool = False) -> Tensor:
        _check_shapes(pred, target)
        if per_sample:
            return _per_sample_mean(
                F.smooth_l1_loss(_float(pred), _float(target), reduction="none")
            )
        return F.smooth_l1_loss(_float(pred), _float(target))


class HybridMSE(_Hybrid):
    """``beta * L_cos + (1 - beta) * L_mse`` (PHI-S eq. 4)."""

    def __init__(self, beta: float = 0.9) -> None:
        super().__init__(MSE(), beta)


class HybridSmoothL1(_Hybrid):
    """``beta * L_cos + (1 - beta) * SmoothL1`` (PHI-S eq. 3; AM-RADIO eq. 3, alpha=0.9)."""

    def __init__(self, beta: float = 0.9) -> None:
        super().__init__(_SmoothL1(), beta)
