"""The tile positional code and the fusion block (FeatSharp paper 3.2; notes 4.2 steps 4-5).

The tile map gets a learned code per tile (``C x k x k``, repeated over each tile's area); the
base-upsampled map and the tile map are concatenated (``2C`` channels per token) and pass one
transformer block with local 2D attention over a ``7 x 7`` neighbourhood and an ALiBi-style
distance bias (row distance for even heads, column distance for odd ones, one slope per
row/column pair), and a SwiGLU MLP from ``2C`` to ``C`` (nominal hidden width ``4C``); the
first ``C`` channels, those of the base path, are kept: the block learns a residual
correction of the base map from the tiles. (FeatSharp's code: the MLP's ``out_features`` is
``C``, its ``hidden_features`` ``4C``; its ALiBi slopes ``2^-(⌊h/2⌋ + 1)``.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from radio_lit.upsamplers.windows import weighted_sum, window_taps

__all__ = ["FusionBlock", "NeighbourhoodAttention", "TileEmbedding"]


class TileEmbedding(nn.Module):
    """A learned code per tile, ``[C, k, k]``, added over each tile's area of the tile map.

    Args:
        dim: channels ``C``.
        factor: tiles per side ``k``.
    """

    def __init__(self, dim: int, factor: int) -> None:
        super().__init__()
        self.factor = factor
        self.code = nn.Parameter(torch.empty(dim, factor, factor))
        nn.init.trunc_normal_(self.code, std=0.02)  # [choice]

    def forward(self, tiles: Tensor) -> Tensor:
        """``tiles [B, k h, k w, C]`` plus each tile's code."""
        h, w = tiles.shape[1] // self.factor, tiles.shape[2] // self.factor
        code = self.code.repeat_interleave(h, 1).repeat_interleave(w, 2)
        return tiles + code.permute(1, 2, 0).to(tiles.dtype)


class NeighbourhoodAttention(nn.Module):
    """Multi-head attention of each token to its ``window x window`` neighbourhood.

    Logits: ``q·k / sqrt(d) - m_h · distance``, the distance along rows for even heads and
    along columns for odd ones, one slope per row/column pair, ``m_h = 2^-(⌊h/2⌋ + 1)``
    (FeatSharp's: ``1/2, 1/2, 1/4, 1/4, ...``; with its 16 heads ALiBi's geometric slopes
    over the 8 pairs); neighbours outside the map are left out.

    Args:
        width: token width ``D``.
        heads: attention heads (``D`` divisible by it).
        window: neighbourhood side (odd).
    """

    def __init__(self, width: int, heads: int, window: int = 7) -> None:
        super().__init__()
        if width % heads:
            raise ValueError(
                f"NeighbourhoodAttention: width {width} is not divisible by {heads} heads"
            )
        self.heads, self.window = heads, window
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        slopes = torch.tensor([2.0 ** -(h // 2 + 1) for h in range(heads)])
        self.register_buffer("slopes", slopes, persistent=False)

    def forward(self, x: Tensor) -> Tensor:
        """``x [B, H, W, D]`` -> ``[B, H, W, D]``."""
        b, height, width, dim = x.shape
        d = dim // self.heads
        qkv = self.qkv(x).permute(0, 3, 1, 2).reshape(b, 3, self.heads, d, height, width)
        q, k, v = qkv.unbind(1)  # [B, heads, d, H, W]
        keys, offsets, inside = window_taps(k, self.window)
        rows = torch.tensor([abs(dy) for dy, _ in offsets], device=x.device, dtype=x.dtype)
        cols = torch.tensor([abs(dx) for _, dx in offsets], device=x.device, dtype=x.dtype)
        even = (torch.arange(self.heads, device=x.device) % 2 == 0)[:, None]
        distance = torch.where(even, rows[None], cols[None])  # [heads, K]
        bias = -self.slopes[:, None].to(x.dtype) * distance
        logits = torch.stack([(q * key).sum(2) for key in keys], 2) * d**-0.5
        logits = logits + bias[None, :, :, None, None]
        logits = logits.masked_fill(~inside[None, None], float("-inf"))
        out = weighted_sum(window_taps(v, self.window)[0], logits.softmax(2), dim=2)
        return self.proj(out.reshape(b, dim, height, width).permute(0, 2, 3, 1))


class SwiGLU(nn.Module):
    """``W_out (silu(W_gate x) * W_up x)``: ``[..., width]`` -> ``[..., out]``."""

    def __init__(self, width: int, hidden: int, out: int) -> None:
        super().__init__()
        self.gate_up = nn.Linear(width, 2 * hidden)
        self.out = nn.Linear(hidden, out)

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, -1)
        return self.out(F.silu(gate) * up)


class FusionBlock(nn.Module):
    """One transformer block over ``[base ‖ tiles]`` that returns the base path's channels.

    Args:
        dim: the teacher's channels ``C`` (the block's width is ``2C``).
        heads: attention heads [notes 4.2: 16].
        window: neighbourhood side [notes 4.2: 7].
        mlp_ratio: nominal SwiGLU hidden width over the teacher's channels ``C`` (FeatSharp's
            ``4C``; the hidden width is ``2/3`` of it, rounded up to a multiple of 8, as
            FeatSharp's); the MLP returns ``C`` channels, added to the kept base channels.
        layer_scale: LayerScale's initial value [notes 4.2: 1e-6].
        norm: LayerNorms before attention and MLP (the 3x preset, ``no-ln``, has none).
    """

    def __init__(
        self,
        dim: int,
        heads: int = 16,
        window: int = 7,
        mlp_ratio: float = 4.0,
        layer_scale: float = 1e-6,
        norm: bool = False,
    ) -> None:
        super().__init__()
        width = 2 * dim
        hidden = -(-int(dim * mlp_ratio * 2 / 3) // 8) * 8
        self.dim = dim
        self.norm1 = nn.LayerNorm(width) if norm else nn.Identity()
        self.attention = NeighbourhoodAttention(width, heads, window)
        self.norm2 = nn.LayerNorm(width) if norm else nn.Identity()
        self.mlp = SwiGLU(width, hidden, dim)
        self.scale1 = nn.Parameter(torch.full((width,), layer_scale))
        self.scale2 = nn.Parameter(torch.full((dim,), layer_scale))

    def forward(self, base: Tensor, tiles: Tensor) -> Tensor:
        """``base``, ``tiles`` ``[B, H, W, C]`` -> ``[B, H, W, C]``."""
        x = torch.cat([base, tiles], -1)
        x = x + self.scale1 * self.attention(self.norm1(x))
        return x[..., : self.dim] + self.scale2 * self.mlp(self.norm2(x))
