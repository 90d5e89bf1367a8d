"""Folding a normalizer's inverse into the adaptor's last linear layer (PHI-S appendix A.6).

The feature head is trained to predict normalized targets ``y' = W' x + b'``; the teacher's
own space is ``y = Θ y' + μ`` (:meth:`~radio_lit.normalizers.Normalizer.affine`). Both are
affine, so one linear layer does both (eqs. 42-44): ``W = Θ W'``, ``b = Θ b' + μ``, and the
exported model pays nothing at run time for the normalization.
"""

from __future__ import annotations

import copy

import torch
from torch import Tensor, nn

from radio_lit.normalizers import Normalizer
from radio_lit.students import MLPHead


@torch.no_grad()
def fold_affine(linear: nn.Linear, theta: Tensor, mu: Tensor) -> nn.Linear:
    """A new ``nn.Linear`` computing ``theta @ linear(x) + mu`` (PHI-S A.6, eqs. 42-43).

    Computed in float64, stored in ``linear``'s dtype and device.

    Args:
        linear: the last layer ``W' [C, H]``, ``b' [C]`` (a missing bias counts as zero).
        theta: ``Θ [C, C]``.
        mu: ``μ [C]``.

    Returns:
        ``nn.Linear(H, C)`` with ``W = Θ W'`` and ``b = Θ b' + μ``.
    """
    out_dim = linear.out_features
    if theta.shape != (out_dim, out_dim) or mu.shape != (out_dim,):
        raise ValueError(
            f"cannot fold an affine map theta {tuple(theta.shape)}, mu {tuple(mu.shape)} into a "
            f"linear layer with {out_dim} outputs: the normalizer and the head disagree on the "
            "teacher's feature width"
        )
    f64 = torch.float64
    weight = linear.weight.to(f64)
    bias = linear.bias.to(f64) if linear.bias is not None else weight.new_zeros(out_dim)
    theta, mu = theta.to(weight), mu.to(weight)
    folded = nn.Linear(
        linear.in_features, out_dim, device=linear.weight.device, dtype=linear.weight.dtype
    )
    folded.weight.copy_(theta @ weight)
    folded.bias.copy_(theta @ bias + mu)
    return folded


def fold_normalizer(head: MLPHead, normalizer: Normalizer) -> MLPHead:
    """A copy of ``head`` whose output is ``normalizer.inverse(head(x))``: the teacher's space.

    Args:
        head: a feature head trained on normalized targets, ``[..., D] -> [..., C]``.
        normalizer: that teacher's fitted normalizer.

    Returns:
        A new head, ``[..., D] -> [..., C]`` in the teacher's own space; ``head`` is unchanged.
    """
    theta, mu = normalizer.affine()
    folded = copy.deepcopy(head)
    folded.out = fold_affine(head.out, theta, mu)
    return folded
