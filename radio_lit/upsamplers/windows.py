"""Sliding-window taps of a feature map, as views (no unfold copy).

The joint-bilateral upsampler, the fusion block's neighbourhood attention and the attention
downsampler all weight a small window of neighbours per output position with a softmax over
the window's taps. :func:`window_taps` gives the taps as strided views of one padded tensor, so
a weighted sum over ``K`` taps holds one copy of the map, not ``K`` (``F.unfold`` would).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["window_taps", "weighted_sum"]


def window_taps(
    x: Tensor, size: int, stride: int = 1, out: tuple[int, int] | None = None
) -> tuple[list[Tensor], list[tuple[int, int]], Tensor]:
    """The ``size x size`` window taps of ``x [..., H, W]`` at every output position.

    Output position ``(i, j)`` sees input positions ``(i * stride + dy, j * stride + dx)``
    with ``dy, dx`` in ``-before .. size - 1 - before``, ``before = size // 2 - (stride - 1) // 2``:
    with ``stride == 1`` the window is centred on the position; with a stride it is centred
    on the middle of the ``stride x stride`` cell it summarizes (exactly for odd strides).

    Args:
        x: ``[..., H, W]``.
        size: window side (odd).
        stride: step between output positions in input positions.
        out: output ``(h, w)``; default ``(H // stride, W // stride)``.

    Returns:
        ``(taps, offsets, inside)``: ``K = size²`` views ``[..., h, w]`` (zeros outside the
        map), the ``(dy, dx)`` of each, and ``inside [K, h, w]`` (bool) where the tap lies in
        the map.
    """
    height, width = x.shape[-2:]
    h, w = out if out is not None else (height // stride, width // stride)
    before = size // 2 - (stride - 1) // 2
    after_h = (h - 1) * stride + size - height - before
    after_w = (w - 1) * stride + size - width - before
    padded = F.pad(x, (before, max(after_w, 0), before, max(after_h, 0)))
    ones = torch.ones(1, 1, height, width, device=x.device, dtype=torch.bool)
    mask = F.pad(ones, (before, max(after_w, 0), before, max(after_h, 0)))[0, 0]
    taps, offsets, inside = [], [], []
    for ty in range(size):
        rows = slice(ty, ty + (h - 1) * stride + 1, stride)
        for tx in range(size):
            cols = slice(tx, tx + (w - 1) * stride + 1, stride)
            taps.append(padded[..., rows, cols])
            inside.append(mask[rows, cols])
            offsets.append((ty - before - (stride - 1) // 2, tx - before - (stride - 1) // 2))
    return taps, offsets, torch.stack(inside)


def weighted_sum(taps: list[Tensor], weights: Tensor, dim: int) -> Tensor:
    """``Σ_k weights.select(dim, k) * taps[k]``: the taps' weighted sum. ``weights`` holds the
    ``K`` taps along ``dim`` and a size-1 channel axis there once a tap is selected, e.g.
    ``[B, K, h, w]`` with taps ``[B, C, h, w]`` (``dim=1``), or ``[B, heads, K, h, w]`` with
    taps ``[B, heads, d, h, w]`` (``dim=2``)."""
    total = weights.select(dim, 0).unsqueeze(dim) * taps[0]
    for k in range(1, len(taps)):
        total = total + weights.select(dim, k).unsqueeze(dim) * taps[k]
    return total
