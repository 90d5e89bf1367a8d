"""Output token merging and unmerging (RADIOv2.5 section 4.8, figure 8; supplement B.4 and I).

RADIOv2.5 hands a VLM a fixed number of tokens from a high-resolution image by merging the
encoder's *output* patch tokens once (not block by block as ToMe does, supplement B.4), by
bipartite soft matching (ToMe, Bolya et al. 2023) on the token *values* (section 4.8: features
match better than attention keys), with the merge destinations ("sinks") laid out on a strided
grid (ToMeSD) so that every image region keeps a representative:

1. sinks: in every ``s x s`` cell of the ``h x w`` token grid, one token (its top-left
   [choice: ToMeSD draws a random position per cell; a fixed one keeps inference
   deterministic]); the other tokens are sources. A side that ``s`` does not divide ends in a
   partial cell, which gets a sink too: ``ceil(h/s) ceil(w/s)`` sinks [choice: ToMeSD floors,
   ``(h // s)(w // s)`` sinks, the border tokens being sources only; RADIOv2.5's 48 x 48 grid
   with ``s`` = 4, 6, 8 has no partial cell];
2. each source is matched to its most similar sink by cosine similarity of the values;
3. the ``r = N - num_tokens`` sources with the highest similarity are merged into their sinks
   (the sink becomes the mean of itself and its merged sources); the other sources are kept.

The result has ``num_tokens`` tokens: the kept sources (in grid order), then the sinks (in grid
order). :func:`unmerge` puts every token back on the grid, a merged source taking its sink's
merged value: the reconstruction whose error RADIOv2.5 table 18 reports.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class TokenMerge:
    """What :func:`merge_tokens` did, for :func:`unmerge` (``M`` merged tokens, ``N`` grid tokens).

    Attributes:
        sources: ``[N_s]`` grid indices of the sources; ``sinks``: ``[N_d]`` of the sinks.
        kept: ``[B, N_s - r]`` indices into ``sources`` of the kept sources (sorted).
        merged: ``[B, r]`` indices into ``sources`` of the merged sources.
        targets: ``[B, r]`` index into ``sinks`` of each merged source's sink.
        sizes: ``[B, M]`` grid tokens each merged token stands for (ToMe's size, for
            proportional attention downstream).
        grid: ``(h, w)``.
    """

    sources: Tensor
    sinks: Tensor
    kept: Tensor
    merged: Tensor
    targets: Tensor
    sizes: Tensor
    grid: tuple[int, int]


def sink_mask(grid: tuple[int, int], stride: int, device: torch.device | None = None) -> Tensor:
    """``[h * w]`` bool, row-major: ``True`` at the top-left token of every ``stride x stride``
    cell (the strided sink layout)."""
    h, w = grid
    ys = torch.arange(h, device=device) % stride == 0
    xs = torch.arange(w, device=device) % stride == 0
    return (ys[:, None] & xs[None, :]).reshape(-1)


def merge_tokens(features: Tensor, num_tokens: int, stride: int) -> tuple[Tensor, TokenMerge]:
    """Merge a token grid ``features [B, h, w, C]`` to ``num_tokens`` tokens.

    Args:
        features: the encoder's output patch tokens.
        num_tokens: tokens to keep, between the number of sinks and ``h * w``.
        stride: sink layout, one sink per ``stride x stride`` cell (table 18: 4, 6, 8).

    Returns:
        ``[B, num_tokens, C]`` (kept sources, then sinks) and the :class:`TokenMerge`.
    """
    batch, h, w, dim = features.shape
    if stride < 1:
        raise ValueError(f"sink stride must be positive, got {stride}")
    is_sink = sink_mask((h, w), stride, features.device)
    sinks = is_sink.nonzero().squeeze(1)
    sources = (~is_sink).nonzero().squeeze(1)
    total = h * w
    if not sinks.numel() <= num_tokens <= total:
        raise ValueError(
            f"cannot merge a {h}x{w} grid to {num_tokens} tokens with {stride}x{stride} sinks: "
            f"choose between {sinks.numel()} (every source merged into the sinks) and {total}"
        )
    r = total - num_tokens
    tokens = features.reshape(batch, total, dim)
    src, dst = tokens[:, sources], tokens[:, sinks]
    scores = F.normalize(src.float(), dim=-1) @ F.normalize(dst.float(), dim=-1).transpose(1, 2)
    best, best_sink = scores.max(dim=-1)  # [B, N_s]
    order = best.argsort(dim=-1, descending=True)
    merged, kept = order[:, :r], order[:, r:].sort(dim=-1).values
    targets = best_sink.gather(1, merged)
    index = targets[..., None].expand(-1, -1, dim)
    moved = src.gather(1, merged[..., None].expand(-1, -1, dim))
    dst = dst.scatter_reduce(1, index, moved, reduce="mean", include_self=True)
    out = torch.cat([src.gather(1, kept[..., None].expand(-1, -1, dim)), dst], dim=1)
    sink_sizes = torch.ones(batch, sinks.numel(), device=features.device)
    sink_sizes = sink_sizes.scatter_add(1, targets, torch.ones_like(targets, dtype=torch.float))
    sizes = torch.cat([torch.ones(batch, kept.shape[1], device=features.device), sink_sizes], 1)
    return out, TokenMerge(sources, sinks, kept, merged, targets, sizes, (h, w))


def unmerge(tokens: Tensor, merge: TokenMerge) -> Tensor:
    """``[B, M, C]`` merged tokens -> ``[B, h, w, C]`` on the grid they came from: kept sources
    and sinks in place, each merged source given its sink's value (for dense use)."""
    batch, _, dim = tokens.shape
    h, w = merge.grid
    num_kept = merge.kept.shape[1]
    kept, dst = tokens[:, :num_kept], tokens[:, num_kept:]
    out = tokens.new_empty(batch, h * w, dim)
    out[:, merge.sinks] = dst
    grid_kept = merge.sources[merge.kept]  # [B, N_s - r] grid indices
    grid_merged = merge.sources[merge.merged]  # [B, r]
    out.scatter_(1, grid_kept[..., None].expand(-1, -1, dim), kept)
    values = dst.gather(1, merge.targets[..., None].expand(-1, -1, dim))
    out.scatter_(1, grid_merged[..., None].expand(-1, -1, dim), values)
    return out.reshape(batch, h, w, dim)


def normalized_reconstruction_error(features: Tensor, reconstruction: Tensor) -> Tensor:
    """``[B]`` normalized MSE of a reconstruction of ``features [B, h, w, C]``: the squared error
    over the squared deviation of the features from their per-image mean token (1 = no better
    than the mean token; RADIOv2.5 table 18 reports about 0.5) [choice: the paper does not give
    its normalization]."""
    x = features.float().flatten(1, 2)
    error = (reconstruction.float().flatten(1, 2) - x).pow(2).sum(dim=(1, 2))
    spread = (x - x.mean(dim=1, keepdim=True)).pow(2).sum(dim=(1, 2))
    return error / spread.clamp_min(torch.finfo(torch.float32).tiny)
