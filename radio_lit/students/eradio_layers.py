"""The building blocks of E-RADIO (AM-RADIO section 5 and supplement A, figures 5 and 6).

- :class:`ConvBN`: convolution + BatchNorm; in eval mode one convolution with the BatchNorm
  folded into its weight and bias.
- :class:`ConvNormAct`: ``Conv2d -> BatchNorm2d -> SiLU``, YOLOv8's convolution unit.
- :class:`C2f`: YOLOv8's "CSP bottleneck with 2 convolutions" (the two convolutional stages).
- :func:`downsample`: 3x3 stride-2 convolution + BatchNorm, between stages (supplement A).
- :class:`WindowedBlock`: a pre-norm transformer block (timm ``Block``'s layout and parameter
  names) whose attention runs inside non-overlapping windows of a feature map (Swin-style
  windows, AM-RADIO supplement A.1).
- :class:`MultiResolutionLayer`: one transformer layer of E-RADIO: windowed attention at the
  map's resolution ("local"), or on the map subsampled 2x by a 3x3 stride-2 convolution and
  brought back by a 3x3 stride-2 deconvolution ("global", supplement A.1, figure 6).

Convolutions take ``[B, C, H, W]`` maps (E-RADIO keeps them in ``channels_last`` memory);
transformer layers take and return token maps ``[B, h, w, C]``, so that a permute between the
two layouts is a view, not a copy.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import Mlp
from torch import Tensor, nn


class ConvBN(nn.Module):
    """``[B, C_in, H, W] -> [B, C_out, H / stride, W / stride]``: convolution (no bias, "same"
    padding), then BatchNorm.

    In eval mode the BatchNorm is folded into the convolution (``w' = w gamma / sigma``,
    ``b' = beta - mu gamma / sigma``, the fusion of
    :func:`torch.nn.utils.fusion.fuse_conv_bn_weights`, here differentiable and recomputed
    from the current parameters on each call): one convolution, same state dict.
    """

    def __init__(self, in_dim: int, out_dim: int, kernel: int = 1, stride: int = 1) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_dim, out_dim, kernel, stride, padding=kernel // 2, bias=False)
        self.bn = nn.BatchNorm2d(out_dim)

    def forward(self, x: Tensor) -> Tensor:
        if self.training or not self.bn.track_running_stats:
            return self.bn(self.conv(x))
        scale = self.bn.weight * torch.rsqrt(self.bn.running_var + self.bn.eps)
        dtype = self.conv.weight.dtype  # float32 statistics, maybe bf16 parameters (FSDP2)
        weight = (self.conv.weight * scale.reshape(-1, 1, 1, 1)).to(dtype)
        bias = (self.bn.bias - self.bn.running_mean * scale).to(dtype)
        return F.conv2d(x, weight, bias, self.conv.stride, self.conv.padding)


class ConvNormAct(ConvBN):
    """:class:`ConvBN` then SiLU, as YOLOv8's ``Conv``."""

    def forward(self, x: Tensor) -> Tensor:
        return F.silu(super().forward(x))


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


def downsample(in_dim: int, out_dim: int) -> ConvBN:
    """The block between stages (supplement A): 3x3 stride-2 convolution, then BatchNorm.
    ``[B, C_in, H, W] -> [B, C_out, ceil(H / 2), ceil(W / 2)]``."""
    return ConvBN(in_dim, out_dim, 3, stride=2)


def upsample(in_dim: int, out_dim: int) -> nn.ConvTranspose2d:
    """3x3 stride-2 deconvolution, ``[B, C_in, H, W] -> [B, C_out, 2 H, 2 W]`` (section 5)."""
    return nn.ConvTranspose2d(in_dim, out_dim, 3, stride=2, padding=1, output_padding=1)


def window_shape(hw: tuple[int, int], window: int) -> tuple[int, int]:
    """The window over an ``h x w`` map: ``window`` per side, or the whole side if shorter."""
    return min(window, hw[0]), min(window, hw[1])


def conv_on_tokens(conv: nn.Module, x: Tensor) -> Tensor:
    """A convolution applied to a token map ``[B, h, w, C]``, returning one (views in and out:
    a contiguous token map is a ``channels_last`` ``[B, C, h, w]`` map)."""
    return conv(x.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


class WindowAttention(nn.Module):
    """Multi-head self-attention inside non-overlapping windows, ``[B, h, w, C]`` to the same.

    The query/key/value projection and the output projection run on the map's own tokens. The
    projected map is zero-padded at the bottom and right to a multiple of the window, cut into
    windows of ``n = wh ww`` tokens, and each window attends within itself
    (:func:`torch.nn.functional.scaled_dot_product_attention` over ``[B nW, heads, n, d]``);
    padded positions are masked out as keys, so every real token's output is independent of the
    padding. A map no larger than the window is one window (global attention). Parameter names
    are those of timm's ``Attention`` (``qkv``, ``proj``).

    Args:
        dim: channels.
        num_heads: attention heads.
        window: window side in positions (supplement A.2: 7).
    """

    def __init__(self, dim: int, num_heads: int, window: int) -> None:
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"{num_heads} heads do not divide {dim} channels")
        self.num_heads, self.window = num_heads, window
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        batch, h, w, dim = x.shape
        wh, ww = window_shape((h, w), self.window)
        pad_h, pad_w = -h % wh, -w % ww
        rows, cols = (h + pad_h) // wh, (w + pad_w) // ww
        qkv = F.pad(self.qkv(x), (0, 0, 0, pad_w, 0, pad_h))
        heads, head_dim = self.num_heads, dim // self.num_heads
        # [B, rows, wh, cols, ww, 3, heads, d] -> [3, B rows cols, heads, wh ww, d]
        qkv = qkv.reshape(batch, rows, wh, cols, ww, 3, heads, head_dim)
        q, k, v = qkv.permute(5, 0, 1, 3, 6, 2, 4, 7).reshape(3, -1, heads, wh * ww, head_dim)
        mask = None
        if pad_h or pad_w:
            valid = x.new_zeros(h + pad_h, w + pad_w, dtype=torch.bool)
            valid[:h, :w] = True
            keys = valid.reshape(rows, wh, cols, ww).permute(0, 2, 1, 3).reshape(-1, wh * ww)
            mask = keys.repeat(batch, 1)[:, None, None, :]  # windows are batch-major
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        # [B rows cols, heads, wh ww, d] -> [B, rows wh, cols ww, C], cropped to the map
        out = out.reshape(batch, rows, cols, heads, wh, ww, head_dim)
        out = out.permute(0, 1, 4, 2, 5, 3, 6).reshape(batch, rows * wh, cols * ww, dim)
        return self.proj(out[:, :h, :w])


class WindowedBlock(nn.Module):
    """A pre-norm transformer block (attention + MLP) with :class:`WindowAttention`,
    ``[B, h, w, C]`` to the same. Parameter names are those of timm's ``Block``, whose forward
    it computes within each window.

    Args:
        dim: channels.
        num_heads: attention heads.
        window: window side in positions (supplement A.2: 7).
        mlp_ratio: MLP hidden width over ``dim``.
    """

    def __init__(self, dim: int, num_heads: int, window: int, mlp_ratio: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = WindowAttention(dim, num_heads, window)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class MultiResolutionLayer(nn.Module):
    """One E-RADIO transformer layer (supplement A.1, figure 6), ``[B, h, w, C]`` to the same.

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
        x = x + conv_on_tokens(self.pos, x)
        if self.down is None or self.up is None:
            return self.attn(x)
        h, w = x.shape[1:3]
        global_ = self.attn(conv_on_tokens(self.down, x))
        return x + conv_on_tokens(self.up, global_)[:, :h, :w]
