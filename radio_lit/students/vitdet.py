"""ViTDet window augmentation (AM-RADIO 4 "High-Resolution ViT Student", supplement C).

ViTDet (Li et al. 2022) alternates windowed and global self-attention. AM-RADIO turns it into
a training augmentation of a plain ViT: each step samples a window size from a set, and since
a transformer is permutation invariant once position embeddings are added, the patch tokens
are reordered so that every window is a contiguous chunk. Windowed blocks then run on
``[B * windows, window**2, D]`` (a reshape) and global blocks on ``[B, tokens, D]``; the last
block is always global, and the original token order is restored at the end. The same code
serves inference as a throughput option (AM-RADIO table 8, "ViTDet-H/16-W8/W16").

The summary and register tokens take no part in windowed blocks: they are set aside while the
patches are windowed and rejoin them at the next global block, as in NVlabs/RADIO's inference
code (``radio/vitdet.py``).

C-RADIOv4 offers ViTDet mode (report 3.2, table 5; notes 2.7) without saying how it is trained;
NVlabs' hook's messages ("enable vit-det for this iteration") hint at a random switch per
iteration. ``[choice]``: a training step runs windowed with probability ``p``
(:func:`windowed_step`), else global. The draw is a function of the run's seed and the step
number alone (not of any generator's state), so every rank makes the same draw without a
collective, and a resumed run makes the draws of the uninterrupted one (its step counter is in
the checkpoint).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import torch
from torch import Tensor, nn


def default_num_windowed(depth: int) -> int:
    """Windowed blocks between global ones in ViTDet's layout: 4 evenly spaced global blocks
    (SAM's ViT-B/L/H encoders: global blocks 2,5,8,11 / 5,11,17,23 / 7,15,23,31)."""
    return max(depth // 4 - 1, 1)


def windowed_step(probability: float, seed: int, step: int) -> bool:
    """Whether training step ``step`` of a run seeded ``seed`` runs ViTDet windows: a
    Bernoulli(``probability``) draw from numpy's generator seeded with ``(seed, step)``
    (``SeedSequence`` mixes both into independent streams). Draws nothing at ``1`` and ``0``."""
    if probability >= 1.0 or probability <= 0.0:
        return probability >= 1.0
    return bool(np.random.default_rng((seed, step)).random() < probability)


def windowed_blocks(depth: int, num_windowed: int) -> list[bool]:
    """Per block, whether it attends within windows: ``num_windowed`` windowed blocks, then
    one global block, repeated (supplement C's ``period = num_windowed + 1``); the last block
    is always global."""
    if num_windowed < 1:
        raise ValueError(f"vitdet_num_windowed must be at least 1, got {num_windowed}")
    period = num_windowed + 1
    return [i % period < num_windowed and i < depth - 1 for i in range(depth)]


def window_order(
    height: int, width: int, window: int, device: torch.device | None = None
) -> Tensor:
    """``[height * width]`` token permutation that makes each ``window x window`` window a
    contiguous chunk: row-major ``(wy y wx x) -> (wy wx y x)`` (supplement C)."""
    index = torch.arange(height * width, device=device)
    index = index.reshape(height // window, window, width // window, window)
    return index.permute(0, 2, 1, 3).reshape(-1)


def run_windowed(
    blocks: Iterable[nn.Module],
    tokens: Tensor,
    num_prefix: int,
    grid: tuple[int, int],
    window: int,
    windowed: list[bool],
) -> Tensor:
    """Run ``blocks`` on ``tokens`` with ViTDet windows; returns tokens in the input order.

    Args:
        blocks: the transformer blocks, each ``[N, T, D] -> [N, T, D]``.
        tokens: ``[B, P + h * w, D]``: ``P`` prefix (summary, register) tokens, then the patch
            tokens in row-major order of the ``h x w`` grid.
        num_prefix: ``P``.
        grid: ``(h, w)``, both multiples of ``window``.
        window: window side in patches.
        windowed: per block, whether it is windowed (see :func:`windowed_blocks`; the last
            block must be global).

    Returns:
        ``[B, P + h * w, D]`` in the same token order as ``tokens``.
    """
    height, width = grid
    if height % window or width % window:
        raise ValueError(f"window {window} does not tile the {height}x{width} patch grid")
    if windowed[-1]:
        raise ValueError("the last block must be global")
    batch, _, dim = tokens.shape
    num_patches = height * width
    num_windows = num_patches // (window * window)
    order = window_order(height, width, window, tokens.device)
    x = torch.cat([tokens[:, :num_prefix], tokens[:, num_prefix:][:, order]], dim=1)
    prefix: Tensor | None = None  # set aside while the patches are windowed
    for block, local in zip(blocks, windowed, strict=True):
        if local and prefix is None:
            prefix = x[:, :num_prefix]
            x = x[:, num_prefix:].reshape(batch * num_windows, window * window, dim)
        elif not local and prefix is not None:
            x = torch.cat([prefix, x.reshape(batch, num_patches, dim)], dim=1)
            prefix = None
        x = block(x)
    restore = torch.argsort(order)
    return torch.cat([x[:, :num_prefix], x[:, num_prefix:][:, restore]], dim=1)
