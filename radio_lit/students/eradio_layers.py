"""The building blocks of E-RADIO (AM-RADIO section 5 and supplement A, figures 5 and 6).

- :class:`ConvNormAct`: ``Conv2d -> BatchNorm2d -> SiLU``, YOLOv8's convolution unit.
- :class:`C2f`: YOLOv8's "CSP bottleneck with 2 convolutions" (the two convolutional stages).
- :func:`downsample`: 3x3 stride-2 convolution + BatchNorm, between stages (supplement A).
- :class:`WindowedBlock`: a pre-norm transformer block (timm's ``Block``) run inside
  non-overlapping windows of a feature map (Swin-style windows, AM-RADIO supplement A.1).
- :class:`MultiResolutionLayer`: one transformer layer of E-RADIO: windowed attention at the
  map's resolution ("local"), or on the map subsampled 2x by a 3x3 stride-2 convolution and
  brought back by a 3x3 stride-2 deconvolution ("global", supplement A.1, figure 6).

Feature maps are ``[B, C, H, W]`` throughout.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.models.swin_transformer import window_partition, window_reverse
from timm.models.vision_transformer import Block
from torch import Tensor, nn


class ConvNormAct(nn.Sequential):
    """``[B, C_in, H, W] -> [B, C_out, H / stride, W / stride]``: convolution (no bias, "same"
    padding), BatchNorm, SiLU, as YOLOv8's ``Conv``."""

    def __init__(self, in_dim: int, out_dim: int, kernel: int = 1, stride: int = 1) -> None:
        super().__init__(
            nn.Conv2d(in_dim, out_dim, kernel, stride, padding=kernel // 2, bias=False),
            nn.BatchNorm2d(out_dim),
            nn.SiLU(),
        )


class Bottleneck(nn.Module):
    """Two 3x3 :class:`ConvNormAct` with a residual connection, ``[B, C, H, W]`` to the same."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.cv1 = ConvNormAct(dim, dim, 3)
        self.cv2 = ConvNormAct(dim, dim, 3)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.cv2(self.cv1(x))


class C2f(nn.Module):
    """YOLOv8's C2f block, ``[B, C, H, W] -> [B, C, H, W]``.

    A 1x1 convolution to ``2 c`` channels (``c = C / 2``) split in two halves; ``n`` bottlenecks
    run one after the other on the second half; the two halves and every bottleneck's output
    (``(2 + n) c`` channels) are concatenated and fused by a 1x1 convolution.

    Args:
        dim: channels ``C`` (even).
        depth: bottlenecks ``n`` (supplement A.2: 3 per convolutional stage).
    """

    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        if dim % 2:
            raise ValueError(f"C2f needs an even channel count, got {dim}")
        hidden = dim // 2
        self.cv1 = ConvNormAct(dim, 2 * hidden)
        self.bottlenecks = nn.ModuleList(Bottleneck(hidden) for _ in range(depth))
        self.cv2 = ConvNormAct((2 + depth) * hidden, dim)

    def forward(self, x: Tensor) -> Tensor:
        parts = list(self.cv1(x).chunk(2, dim=1))
        for bottleneck in self.bottlenecks:
            parts.append(bottleneck(parts[-1]))
        return self.cv2(torch.cat(parts, dim=1))


def downsample(in_dim: int, out_dim: int) -> nn.Sequential:
    """The block between stages (supplement A): 3x3 stride-2 convolution, then BatchNorm.
    ``[B, C_in, H, W] -> [B, C_out, ceil(H / 2), ceil(W / 2)]``."""
    return nn.Sequential(
        nn.Conv2d(in_dim, out_dim, 3, stride=2, padding=1, bias=False),
        nn.BatchNorm2d(out_dim),
    )


def upsample(in_dim: int, out_dim: int) -> nn.ConvTranspose2d:
    """3x3 stride-2 deconvolution, ``[B, C_in, H, W] -> [B, C_out, 2 H, 2 W]`` (section 5)."""
    return nn.ConvTranspose2d(in_dim, out_dim, 3, stride=2, padding=1, output_padding=1)


def window_shape(hw: tuple[int, int], window: int) -> tuple[int, int]:
    """The window over an ``h x w`` map: ``window`` per side, or the whole side if shorter."""
    return min(window, hw[0]), min(window, hw[1])


class WindowedBlock(nn.Module):
    """A timm transformer block (pre-norm attention + MLP) inside non-overlapping windows.

    The ``h x w`` map is zero-padded at the bottom and right to a multiple of the window; padded
    positions are masked out as keys, so every real token's output is independent of the
    padding. A map no larger than the window is one window (global attention).

    Args:
        dim: channels.
        num_heads: attention heads.
        window: window side in positions (supplement A.2: 7).
        mlp_ratio: MLP hidden width over ``dim``.
    """

    def __init__(self, dim: int, num_heads: int, window: int, mlp_ratio: float) -> None:
        super().__init__()
        self.window = window
        self.block = Block(dim, num_heads, mlp_ratio=mlp_ratio, qkv_bias=True)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, C, h, w] -> [B, C, h, w]``."""
        batch, dim, h, w = x.shape
        wh, ww = window_shape((h, w), self.window)
        pad_h, pad_w = -h % wh, -w % ww
        tokens = F.pad(x.permute(0, 2, 3, 1), (0, 0, 0, pad_w, 0, pad_h))
        hp, wp = h + pad_h, w + pad_w
        windows = window_partition(tokens, (wh, ww)).reshape(-1, wh * ww, dim)
        mask = None
        if pad_h or pad_w:
            valid = x.new_zeros(1, hp, wp, 1, dtype=torch.bool)
            valid[:, :h, :w] = True
            keys = window_partition(valid, (wh, ww)).reshape(-1, 1, 1, wh * ww)
            mask = keys.repeat(batch, 1, 1, 1)  # windows are batch-major
        out = self.block(windows, attn_mask=mask).reshape(-1, wh, ww, dim)
        out = window_reverse(out, (wh, ww), hp, wp)[:, :h, :w]
        return out.permute(0, 3, 1, 2)


class MultiResolutionLayer(nn.Module):
    """One E-RADIO transformer layer (supplement A.1, figure 6), ``[B, C, h, w]`` to the same.

    A depthwise 3x3 convolution adds position information first [choice: windowed attention
    needs some; the paper names none, convolutional position encoding as in CPVT]. Then:

    - ``subsample=False`` ("local"): windowed attention on the map;
    - ``subsample=True`` ("global"): the map is downsampled 2x by a 3x3 stride-2 convolution,
      windowed attention runs there (each window sees 4x the area), and a 3x3 stride-2
      deconvolution brings the result back, added to the input [choice: residual].

    Args:
        dim: channels.
        num_heads: attention heads.
        window: window side (7 in supplement A.2).
        mlp_ratio: MLP hidden width over ``dim`` [choice: 4, as ViT].
        subsample: run at half resolution.
    """

    def __init__(
        self, dim: int, num_heads: int, window: int, mlp_ratio: float, subsample: bool
    ) -> None:
        super().__init__()
        self.pos = nn.Conv2d(dim, dim, 3, padding=1, groups=dim)
        self.attn = WindowedBlock(dim, num_heads, window, mlp_ratio)
        self.down = nn.Conv2d(dim, dim, 3, stride=2, padding=1) if subsample else None
        self.up = upsample(dim, dim) if subsample else None

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.pos(x)
        if self.down is None or self.up is None:
            return self.attn(x)
        h, w = x.shape[-2:]
        return x + self.up(self.attn(self.down(x)))[..., :h, :w]
