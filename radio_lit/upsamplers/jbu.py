"""Image-guided base upsampler: a learnable joint-bilateral upsampling stack (FeatSharp paper
3.2, after FeatUp's JBU; notes 4.2 step 3).

Each stage upsamples by one prime factor of ``k`` (3x: one stage; 4x: two of 2x). At an output
position ``q`` it averages the bilinearly upsampled map over a ``(2r + 1)²`` window:

    out(q) = Σ_n softmax_n( -|q - n|² / (2 σ_s²) - ‖g(q) - g(n)‖² / (2 σ_r²) ) · up(F)(n)

with a learned spatial scale ``σ_s``, a learned range scale ``σ_r`` and ``g`` a learned
per-pixel embedding of the guidance image at the output's resolution. A 1x1 convolution,
zero at the start, adds a learned correction [choice]. The weights depend on the image only,
so a stage commutes with any affine map of the features whose weights sum to one.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from radio_lit.data.views import resize_view
from radio_lit.upsamplers.windows import weighted_sum, window_taps

__all__ = ["JBUStack", "JBUStage", "prime_factors"]


def prime_factors(n: int) -> list[int]:
    """``n``'s prime factors in ascending order (12 -> [2, 2, 3])."""
    factors, p = [], 2
    while n > 1:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors


class JBUStage(nn.Module):
    """One joint-bilateral upsampling by ``factor`` (module docstring).

    Args:
        dim: feature channels ``C``.
        factor: upsampling factor of this stage.
        radius: window radius ``r`` in output positions [choice: FeatUp's 3].
        guidance_dim: channels of the range embedding ``g`` [choice].
    """

    def __init__(self, dim: int, factor: int, radius: int = 3, guidance_dim: int = 32) -> None:
        super().__init__()
        self.factor, self.radius = factor, radius
        # no bias on the last layer: it cancels in g(q) - g(n), so its gradient is rounding
        # noise that can be too small to move it (TrainingProgressGuard then stops the run)
        self.range_embedding = nn.Sequential(
            nn.Conv2d(3, guidance_dim, 1),
            nn.GELU(),
            nn.Conv2d(guidance_dim, guidance_dim, 1, bias=False),
        )
        self.log_sigma_spatial = nn.Parameter(torch.tensor(math.log(float(factor))))
        self.log_sigma_range = nn.Parameter(torch.zeros(()))
        self.correction = nn.Conv2d(dim, dim, 1)
        nn.init.zeros_(self.correction.weight)
        nn.init.zeros_(self.correction.bias)

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: object) -> None:
        """A checkpoint saved with the range embedding's last bias loads without it (the
        bias cancels in the range term: it never changed the output)."""
        state_dict.pop(f"{prefix}range_embedding.2.bias", None)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(self, features: Tensor, image: Tensor) -> Tensor:
        """``features [B, C, h, w]``, guidance ``image [B, 3, H', W']`` -> ``[B, C, f h, f w]``."""
        size = (features.shape[-2] * self.factor, features.shape[-1] * self.factor)
        up = F.interpolate(features, size=size, mode="bilinear", align_corners=False)
        guide = self.range_embedding(resize_view(image, size).to(features.dtype))
        side = 2 * self.radius + 1
        guides, offsets, inside = window_taps(guide, side)
        spatial = torch.tensor([dy * dy + dx * dx for dy, dx in offsets], device=up.device)
        spatial = -spatial.to(up.dtype) / (2 * self.log_sigma_spatial.exp() ** 2)
        range_scale = 2 * self.log_sigma_range.exp() ** 2
        logits = torch.stack([-(guide - g).square().sum(1) / range_scale for g in guides], 1)
        logits = logits + spatial[None, :, None, None]
        logits = logits.masked_fill(~inside[None], float("-inf"))
        out = weighted_sum(window_taps(up, side)[0], logits.softmax(1), dim=1)
        return out + self.correction(out)


class JBUStack(nn.Module):
    """Joint-bilateral upsampling by ``factor``, one :class:`JBUStage` per prime factor.

    Args:
        dim: feature channels ``C``.
        factor: total upsampling factor ``k``.
        radius: window radius of every stage.
        guidance_dim: range-embedding channels of every stage.
    """

    def __init__(self, dim: int, factor: int, radius: int = 3, guidance_dim: int = 32) -> None:
        super().__init__()
        if factor < 2:
            raise ValueError(f"JBUStack: factor must be at least 2, got {factor}")
        self.factor = factor
        self.stages = nn.ModuleList(
            JBUStage(dim, p, radius, guidance_dim) for p in prime_factors(factor)
        )

    def forward(self, features: Tensor, image: Tensor) -> Tensor:
        """``features [B, C, h, w]``, ``image [B, 3, H', W']`` in [0, 1] -> ``[B, C, k h, k w]``."""
        for stage in self.stages:
            features = stage(features, image)
        return features
