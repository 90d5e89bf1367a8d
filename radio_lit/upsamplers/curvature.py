"""The curvature of the bias's objective, and the preconditioner of the bias's gradient
(FeatSharp paper 3.3-3.4; docs/featsharp.md "Why the zero-started bias did not learn").

The bias learns from :meth:`~radio_lit.upsamplers.FeatSharpModule.locked_loss`, a quadratic in
the bias ``B``: per channel, ``Σ_v c_v · ((W_v - I) B + r_v)² / Σ_v Σ c_v`` over the views
``v``, with ``W_v [n, n]`` the view's warp on the token grid (``n = h w`` tokens, reflection at
the border), ``c_v [n]`` the part of each token the image covers and ``r_v`` what the images
put there. Its curvature, ``H = Σ_v (W_v - I)ᵀ diag(c_v) (W_v - I) / Σ_v Σ c_v`` (the same
for every channel, up to the factor ``2 / C``), depends on the views' transforms alone.

The views are small warps about the image's centre (zoom, rotation, perspective), under which
a smooth pattern (a plane over the grid, the tokens near the centre) hardly changes: ``H``'s
smallest non-zero eigenvalue is 0.7 % of its largest at an 8x8 grid, 0.2 % at 24x24 (its
null direction is the constant, which no view changes). NAdam, the paper's optimizer, scales
each coordinate (token, channel) by its own gradient's size; along such weak directions a
bias trained so drifts, and grows a tilt of its own instead of the pattern's (8x8 grid, kind
``structured`` of benchmarks/featsharp.py, 300 steps from zero: 31 % of the pattern removed,
where the objective's own optimum removes 91 %; docs/featsharp.md). Multiplied by
:func:`preconditioner` first, every direction of the gradient is the distance to the optimum
along it, and NAdam brings each at its rate [choice: not in the paper].
"""

from __future__ import annotations

import torch
from torch import Tensor

from radio_lit.upsamplers.views import warp_cells

__all__ = ["locked_curvature", "precondition", "preconditioner"]


def locked_curvature(matrices: Tensor, grid: tuple[int, int], cell: float) -> Tensor:
    """``H [n, n]`` (module docstring) of the views whose pixel transforms are ``matrices
    [V, 3, 3]``, on a ``grid = (h, w)`` of tokens ``cell`` pixels wide, in ``matrices``'
    dtype and device: each view's ``W_v`` is the warp of every one-token map
    (:func:`~radio_lit.upsamplers.views.warp_cells`, as the objective warps), ``c_v`` the warp
    of a map of ones with zeros outside."""
    h, w = grid
    n = h * w
    eye = torch.eye(n, dtype=matrices.dtype, device=matrices.device)
    basis = eye.reshape(n, 1, h, w)
    ones = basis.new_ones(1, 1, h, w)
    curvature, covered = torch.zeros_like(eye), matrices.new_zeros(())
    for matrix in matrices:
        warp = warp_cells(basis, matrix.expand(n, 3, 3), cell).reshape(n, n).T  # out x in
        coverage = warp_cells(ones, matrix[None], cell, "zeros").reshape(n)
        change = (warp - eye) * coverage.sqrt()[:, None]
        curvature += change.T @ change
        covered += coverage.sum()
    return curvature / covered.clamp_min(1e-12)


def preconditioner(curvature: Tensor, ridge: float = 1e-3) -> Tensor:
    """``P [n, n]`` for a curvature ``H [n, n]`` (symmetric, positive semi-definite): over
    ``H``'s eigenvectors ``u_i`` whose eigenvalue ``λ_i`` exceeds ``1e-9`` of the largest,
    ``Σ_i (λ_1 + ρ) / (λ_i + ρ) u_i u_iᵀ`` with ``λ_1`` the smallest of them and ``ρ =
    ridge · λ_max`` [choice: 1e-3; it bounds what a direction of almost no curvature gains];
    zero along the null directions (the constant, whose gradient is zero). Its largest
    eigenvalue is 1: it never enlarges a gradient (the clipping of the other parameters'
    gradients is left as it was)."""
    values, vectors = torch.linalg.eigh(curvature)
    largest = values[-1].clamp_min(1e-30)
    kept = values > 1e-9 * largest
    values, vectors = values[kept], vectors[:, kept]
    damped = values + ridge * largest
    return (vectors * (damped[0] / damped)) @ vectors.T


def precondition(gradient: Tensor, matrix: Tensor) -> Tensor:
    """The bias's gradient ``[C, h, w]`` times ``P [h w, h w]`` (:func:`preconditioner`), per
    channel."""
    channels, h, w = gradient.shape
    flat = gradient.reshape(channels, h * w) @ matrix.to(gradient.dtype)
    return flat.reshape(channels, h, w)
