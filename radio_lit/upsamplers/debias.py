"""The learned de-biasing buffer (FeatSharp paper 3.3; notes 4.3).

A learnable map ``B [C, h, w]`` on the teacher's token grid, zero at the start, added to every
teacher output the upsampler sees (the low-resolution pass, each tile, and the training
targets): multi-view consistency can only be met when the teacher's position-locked noise is
cancelled, so ``B`` learns its negative. Its mean over the grid is left out
(:meth:`BiasBuffer.pattern`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["BiasBuffer"]


class BiasBuffer(nn.Module):
    """A learned bias on the teacher's ``grid``, added to features ``[B, H, W, C]``.

    Args:
        dim: channel count ``C``.
        grid: the teacher's token grid ``(h, w)`` at its native resolution.
    """

    def __init__(self, dim: int, grid: tuple[int, int]) -> None:
        super().__init__()
        self.bias = nn.Parameter(torch.zeros(dim, *grid))
        self.learns = True

    def learning(self, learns: bool) -> BiasBuffer:
        """Let the bias take gradients from what it is added to (``True``) or only its value
        (``False``); returns itself."""
        self.learns = learns
        return self

    def pattern(self, grid: tuple[int, int]) -> Tensor:
        """The bias ``[h, w, C]`` less its mean over the grid, on ``grid`` (bilinearly resized
        if it differs [notes 4.3]).

        The mean is left out [choice]: a constant offset is not locked to positions (the
        normalizer's mean is the features' own), and no objective sees it, as it is added to
        the inputs and the targets alike: the upsampler carries it to its output. NAdam, which
        scales each token's step by its own gradient's size, lets it drift: from a zero start
        at an 8x8 grid (kind ``structured``, 300 steps) to an RMS of 0.5-0.8 per channel,
        the pattern's own size, and FeatSharp's error to the truth 1.4-2.1x bilinear's with
        87-89 % of the pattern removed (benchmarks/featsharp.py)."""
        bias = self.bias if self.learns else self.bias.detach()
        bias = bias - bias.mean((1, 2), keepdim=True)
        if tuple(bias.shape[1:]) != tuple(grid):
            bias = F.interpolate(bias[None], size=grid, mode="bilinear", align_corners=False)[0]
        return bias.permute(1, 2, 0)

    def forward(self, features: Tensor, tiles: int = 1) -> Tensor:
        """``features [B, H, W, C]`` plus the bias; with ``tiles = k`` the map is ``k x k``
        stitched teacher outputs and each tile gets its own copy of the bias."""
        height, width = features.shape[1:3]
        bias = self.pattern((height // tiles, width // tiles)).repeat(tiles, tiles, 1)
        return features + bias.to(features.dtype)
