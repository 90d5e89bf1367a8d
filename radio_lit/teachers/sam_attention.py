"""SAM's image-encoder attention through ``F.scaled_dot_product_attention``.

segment-anything's ``Attention`` materialises ``softmax(q k^T * scale + B) v`` by hand, with
MViTv2's decomposed relative positions added as an explicit ``[B * heads, N, N]`` term
(``add_decomposed_rel_pos``; 44% of SAM's time on its global blocks). Here the same bias
``B[(i, j), (k, l)] = q_ij . R^h_{i - k} + q_ij . R^w_{j - l}`` (Li et al. 2022, eq. 4; SAM
uses the unscaled ``q``) is given to SDPA as an additive mask, so the fused kernels (flash
attention does not take a mask; memory-efficient attention and the CPU kernel do) compute the
softmax and the product, with equal outputs. The relative-position indices are built on the
table's device (segment-anything builds them on the CPU, a host-to-device copy per block).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from segment_anything.modeling.image_encoder import Attention, get_rel_pos
from torch import Tensor, nn


def relative_positions(size: int, table: Tensor) -> Tensor:
    """``[size, size, C]`` entries ``table[i - k + size - 1]`` of a ``[2 * size - 1, C]`` table
    (segment-anything's ``get_rel_pos`` for equal query and key sizes, indices on the table's
    device); other table lengths are interpolated by ``get_rel_pos`` itself."""
    if table.shape[0] != 2 * size - 1:
        return get_rel_pos(size, size, table)
    coords = torch.arange(size, device=table.device)
    return table[coords[:, None] - coords[None, :] + (size - 1)]


def relative_position_bias(
    q: Tensor, rel_h: Tensor, rel_w: Tensor, size: tuple[int, int]
) -> Tensor:
    """Additive attention bias ``[B, heads, H * W, H * W]`` of queries ``q [B, heads, H * W, C]``
    with the height and width tables ``rel_h [2H - 1, C]``, ``rel_w [2W - 1, C]``."""
    height, width = size
    batch, heads, tokens, channels = q.shape
    grid = q.reshape(batch * heads, height, width, channels)
    along_h = torch.einsum("bhwc,hkc->bhwk", grid, relative_positions(height, rel_h))
    along_w = torch.einsum("bhwc,wkc->bhwk", grid, relative_positions(width, rel_w))
    bias = along_h[:, :, :, :, None] + along_w[:, :, :, None, :]  # [BH, H, W, H, W]
    return bias.reshape(batch, heads, tokens, tokens)


class SDPAAttention(Attention):
    """segment-anything's ``Attention`` (same parameters and state dict) computed by SDPA.

    ``[B, H, W, dim] -> [B, H, W, dim]``; SDPA's default scale ``head_dim ** -0.5`` is SAM's.
    """

    def forward(self, x: Tensor) -> Tensor:
        batch, height, width, _ = x.shape
        qkv = self.qkv(x).reshape(batch, height * width, 3, self.num_heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, heads, N, head_dim] each
        bias = None
        if self.use_rel_pos:
            bias = relative_position_bias(q, self.rel_pos_h, self.rel_pos_w, (height, width))
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.proj(out.transpose(1, 2).reshape(batch, height, width, -1))


def use_sdpa(encoder: nn.Module) -> nn.Module:
    """Make every segment-anything ``Attention`` in ``encoder`` an :class:`SDPAAttention` (in
    place: same parameters, same state dict). Returns ``encoder``."""
    for module in encoder.modules():
        if type(module) is Attention:
            module.__class__ = SDPAAttention
    return encoder
