"""The multi-view consistency objective (FeatSharp paper 3.4; notes 4.4 "Per-view loss").

For each jittered view the high-resolution prediction, warped into the view and brought to the
teacher's grid by the learned downsampler, is compared with the teacher's own (normalized,
de-biased) output on that view: a per-position squared error (mean over channels), weighted by
the part of the view the image covers, by a seam map that doubles the weight where tiles meet,
and by a learned uncertainty ``exp(-u)`` with the regulariser ``u / 2``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Uncertainty", "consistency_loss", "seam_weights"]


def seam_weights(grid: tuple[int, int], factor: int, weight: float = 2.0) -> Tensor:
    """``[k h, k w]``: ``weight`` on the rows and columns of cells that touch a seam between
    two tiles, 1 elsewhere, scaled to mean 1 [notes 4.4: ``grid_weight`` 2.0, renormalised]."""
    height, width = grid

    def seams(n: int) -> Tensor:
        side = n // factor
        index = torch.arange(n)
        at = ((index % side == 0) | (index % side == side - 1)) & (index > 0) & (index < n - 1)
        return at

    mask = seams(height)[:, None] | seams(width)[None, :]
    weights = torch.where(mask, torch.tensor(weight), torch.tensor(1.0))
    return weights / weights.mean()


class Uncertainty(nn.Module):
    """A per-position log-scale ``u [B, h, w]`` of the target's error, from the target
    ``[B, h, w, C]``; its last layer starts at zero (``u = 0``: every position weighs 1).

    Args:
        dim: channels ``C``.
        hidden: channels of the hidden layer [choice].
    """

    def __init__(self, dim: int, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(dim, hidden, 3, padding=1), nn.GELU(), nn.Conv2d(hidden, 1, 3, padding=1)
        )
        nn.init.zeros_(self.net[-1].weight)
        nn.init.zeros_(self.net[-1].bias)

    def forward(self, target: Tensor) -> Tensor:
        return self.net(target.permute(0, 3, 1, 2))[:, 0]


def consistency_loss(
    prediction: Tensor, target: Tensor, weight: Tensor, log_scale: Tensor | None = None
) -> Tensor:
    """``Σ w · (exp(-u) e + u / 2) / Σ w`` with ``e`` the squared error averaged over channels.

    Args:
        prediction: ``[N, h, w, C]``.
        target: ``[N, h, w, C]``.
        weight: ``[N, h, w]`` (coverage x seams), non-negative.
        log_scale: ``[N, h, w]`` the uncertainty ``u``, or ``None`` (``u = 0``).
    """
    error = (prediction - target).square().mean(-1)
    if log_scale is not None:
        error = torch.exp(-log_scale) * error + log_scale / 2
    return (error * weight).sum() / weight.sum().clamp_min(1e-6)


def cell_average(x: Tensor, factor: int) -> Tensor:
    """``[N, k h, k w]`` averaged over each ``k x k`` cell -> ``[N, h, w]``."""
    return F.avg_pool2d(x[:, None], factor)[:, 0]
