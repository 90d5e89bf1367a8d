"""What a packed student forward costs (issue 52; :mod:`radio_lit.students.packing`).

A packed forward runs its token-wise GEMMs (``qkv``, ``proj``, the MLP) once over the sum of
the rank's tokens, ``N = sum_i n_i`` (``n_i`` = prefix + patches of image ``i``), and attention
per image (``n_i^2`` each, block-diagonal). Padding every image to the longest ``L`` pays
``N' = B * L`` tokens in the GEMMs and ``B * L^2`` in attention. The plan prices a packed step
with :func:`packed_forward_flops` when ``model.student_packing`` is set (one forward over the
sum of tokens: the calibration's GEMM efficiency for ``N`` rows, not for each draw's own).
"""

from __future__ import annotations

from collections.abc import Sequence


def packed_forward_flops(
    depth: int, width: int, mlp_ratio: float, images: Sequence[tuple[int, int]]
) -> dict[str, float]:
    """Forward FLOPs (2 per multiply-add) of a ViT's blocks on packed images.

    Args:
        depth, width, mlp_ratio: the ViT's blocks (``D = width``; MLP hidden ``mlp_ratio * D``).
        images: ``(count, tokens)`` per group of equal images (tokens: prefix + patches).

    Returns:
        ``{"tokens": N, "linear": ..., "attention": ...}``: ``linear = 2 N (4 + 2 r) D^2`` per
        block (``qkv`` 3D², ``proj`` D², MLP 2rD²); ``attention = 4 D sum_i n_i^2`` per block
        (``QK^T`` and ``AV``), each times ``depth``.
    """
    if any(count < 0 or tokens < 1 for count, tokens in images):
        raise ValueError(f"images must be (count >= 0, tokens >= 1) pairs, got {list(images)}")
    tokens = sum(count * n for count, n in images)
    linear = 2.0 * tokens * (4.0 + 2.0 * mlp_ratio) * width * width * depth
    attention = 4.0 * width * sum(count * n * n for count, n in images) * depth
    return {"tokens": float(tokens), "linear": linear, "attention": attention}


def padded_forward_flops(
    depth: int, width: int, mlp_ratio: float, images: Sequence[tuple[int, int]]
) -> dict[str, float]:
    """:func:`packed_forward_flops` with every image padded to the longest's tokens."""
    longest = max(n for _, n in images)
    return packed_forward_flops(depth, width, mlp_ratio, [(sum(c for c, _ in images), longest)])
