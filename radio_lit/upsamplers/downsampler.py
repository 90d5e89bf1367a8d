"""The learned attention downsampler of the multi-view objective (FeatSharp paper 3.4; notes
4.4 step 2).

It maps a high-resolution map back to the teacher's grid as the teacher would see it: a fixed
``5 x 5`` Gaussian blur, then at every output cell a softmax-weighted average over a
``9 x 9`` window of the blurred map, with logits from a convolution of the map (a saliency per
position) plus a learned bias per window tap; in training 20 % of the content logits are
zeroed, each tap keeping its bias (FeatSharp's code: ``patches * keep_mask + logit_bias``).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from radio_lit.upsamplers.windows import weighted_sum, window_taps

__all__ = ["AttentionDownsampler"]


class AttentionDownsampler(nn.Module):
    """``[B, C, k h, k w]`` -> ``[B, C, h, w]`` (module docstring).

    Args:
        dim: channels ``C``.
        factor: downsampling factor ``k``.
        kernel: window side [notes 4.4: 9].
        blur: side of the fixed Gaussian pre-blur [notes 4.4: 5].
        sigma: the pre-blur's standard deviation in high-resolution cells [FeatSharp's code:
            ``exp(-x² / sqrt(1/2))``, ``sigma = 2^(-3/4) ≈ 0.59``]. It must stay below the
            teacher's own pooling: a ``k x k`` cell average has a standard deviation of
            ``sqrt((k² - 1) / 12)`` (0.82 for ``k = 3``), and a softmax window (positive
            weights) only widens the blur, so a wider pre-blur leaves no downsampler that
            matches the teacher and the upsampler must over-sharpen to meet the targets.
        dropout: share of content logits zeroed in training [notes 4.4: 0.2] (FeatSharp's
            code also zeroes them outside training; here validation's downsampler is
            deterministic [choice]).
    """

    def __init__(
        self,
        dim: int,
        factor: int,
        kernel: int = 9,
        blur: int = 5,
        sigma: float = 2.0**-0.75,
        dropout: float = 0.2,
    ) -> None:
        super().__init__()
        self.factor, self.kernel, self.dropout = factor, kernel, dropout
        self.blur, self.sigma = blur, sigma
        self.saliency = nn.Conv2d(dim, 1, 3, padding=1)  # [choice: a 3x3 convolution]
        self.tap_bias = nn.Parameter(torch.zeros(kernel * kernel))

    def forward(self, x: Tensor) -> Tensor:
        size = (x.shape[-2] // self.factor, x.shape[-1] // self.factor)
        from kornia.filters import gaussian_blur2d  # kornia: imported by FeatSharp's use only

        blurred = gaussian_blur2d(
            x, (self.blur, self.blur), (self.sigma, self.sigma), border_type="reflect"
        )
        values, _, inside = window_taps(blurred, self.kernel, self.factor, size)
        saliency, _, _ = window_taps(self.saliency(x)[:, 0], self.kernel, self.factor, size)
        content = torch.stack(saliency, 1)
        if self.training and self.dropout > 0:
            content = content * (torch.rand_like(content) >= self.dropout)
        logits = content + self.tap_bias[None, :, None, None]
        logits = logits.masked_fill(~inside[None], float("-inf"))  # taps outside the map
        return weighted_sum(values, logits.softmax(1), dim=1)
