"""SAM's image-encoder attention through ``F.scaled_dot_product_attention``, and its blocks'
window path with one copy out instead of two.

segment-anything's ``Attention`` materialises ``softmax(q k^T * scale + B) v`` by hand, with
MViTv2's decomposed relative positions added as an explicit ``[B * heads, N, N]`` term
(``add_decomposed_rel_pos``; 44% of SAM's time on its global blocks). Here the same bias
``B[(i, j), (k, l)] = q_ij . R^h_{i - k} + q_ij . R^w_{j - l}`` (Li et al. 2022, eq. 4; SAM
uses the unscaled ``q``) is given to SDPA as an additive mask, so the fused kernels (flash
attention does not take a mask; memory-efficient attention and the CPU kernel do) compute the
softmax and the product, with equal outputs. The bias is assembled with one copy of ``q`` (laid
out for both batched products), written once, contiguous, and on CUDA with its rows padded to
the 16 elements the memory-efficient kernel needs (PyTorch would otherwise pad a copy of it at
every call); the relative-position indices are buffers built once on the table's device.

segment-anything's ``Block`` makes the windowed attention's output contiguous twice (the
window order back to rows, then the padding cut off); the padding is cut off here as a view
that the residual addition reads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from segment_anything.modeling.image_encoder import (
    Attention,
    Block,
    get_rel_pos,
    window_partition,
)
from torch import Tensor, nn

#: Elements a row of an attention mask is padded to on CUDA (memory-efficient attention's
#: alignment, PyTorch's ``preprocess_mask``).
MASK_ALIGNMENT = 16


def relative_index(size: int, device: torch.device | None = None) -> Tensor:
    """``[size, size]`` indices ``i - k + size - 1`` into a ``[2 * size - 1, C]`` table."""
    coords = torch.arange(size, device=device)
    return coords[:, None] - coords[None, :] + (size - 1)


def relative_positions(size: int, table: Tensor, index: Tensor | None = None) -> Tensor:
    """``[size, size, C]`` entries ``table[i - k + size - 1]`` of a ``[2 * size - 1, C]`` table
    (segment-anything's ``get_rel_pos`` for equal query and key sizes; ``index``: the
    :func:`relative_index` of ``size``, built here if not given); other table lengths are
    interpolated by ``get_rel_pos`` itself."""
    if table.shape[0] != 2 * size - 1:
        return get_rel_pos(size, size, table)
    return table[relative_index(size, table.device) if index is None else index]


def relative_position_bias(
    q: Tensor,
    rel_h: Tensor,
    rel_w: Tensor,
    size: tuple[int, int],
    index_h: Tensor | None = None,
    index_w: Tensor | None = None,
) -> Tensor:
    """Additive attention bias ``[B, heads, H * W, H * W]`` of queries ``q [B, heads, H * W, C]``
    with the height and width tables ``rel_h [2H - 1, C]``, ``rel_w [2W - 1, C]``.

    ``along_h[i, (b, n, j), k] = q[b, n, (i, j)] . R^h_{i - k}`` and
    ``along_w[j, (i, b, n), l] = q[b, n, (i, j)] . R^w_{j - l}`` are two batched products over one
    copy of ``q`` laid out ``[H, B, heads, W, C]``; their broadcast sum is written once into the
    bias. On CUDA (eager) its rows are padded to :data:`MASK_ALIGNMENT` elements (a view of the
    first ``H * W`` columns is returned); elsewhere, and under ``torch.compile`` (which rewrites
    ``out=`` and picks layouts itself), the two small terms are first laid out as the sum.
    """
    height, width = size
    batch, heads, tokens, channels = q.shape
    table_h = relative_positions(height, rel_h, index_h)  # [H, H, C]
    table_w = relative_positions(width, rel_w, index_w)  # [W, W, C]
    rows = q.reshape(batch, heads, height, width, channels).permute(2, 0, 1, 3, 4)
    rows = rows.reshape(height, batch * heads * width, channels)  # the one copy of q
    along_h = torch.bmm(rows, table_h.transpose(1, 2))  # [H, B heads W, H]
    cols = rows.view(height * batch * heads, width, channels).transpose(0, 1)
    along_w = torch.bmm(cols, table_w.transpose(1, 2))  # [W, H B heads, W]
    along_h = along_h.view(height, batch, heads, width, height).permute(1, 2, 0, 3, 4)
    along_w = along_w.view(width, height, batch, heads, width).permute(2, 3, 1, 0, 4)
    grid = (batch, heads, height, width, height, width)
    if q.is_cuda and not torch.compiler.is_compiling():  # eager CUDA: rows padded, one write
        row = -(-tokens // MASK_ALIGNMENT) * MASK_ALIGNMENT
        bias = torch.empty(batch, heads, tokens, row, dtype=along_h.dtype, device=q.device)
        bias = bias[..., :tokens]
        torch.add(along_h[..., None], along_w[..., None, :], out=bias.view(grid))
        return bias
    # the small terms laid out as the sum: the sum is written contiguous, once
    bias = along_h.contiguous()[..., None] + along_w.contiguous()[..., None, :]
    return bias.view(batch, heads, tokens, tokens)


class SDPAAttention(Attention):
    """segment-anything's ``Attention`` (same parameters and state dict) computed by SDPA.

    ``[B, H, W, dim] -> [B, H, W, dim]``; SDPA's default scale ``head_dim ** -0.5`` is SAM's.
    Its relative-position indices are non-persistent buffers (:func:`use_sdpa` adds them).
    """

    index_h: Tensor | None
    index_w: Tensor | None

    def forward(self, x: Tensor) -> Tensor:
        batch, height, width, _ = x.shape
        qkv = self.qkv(x).reshape(batch, height * width, 3, self.num_heads, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # [B, heads, N, head_dim] each
        bias = None
        if self.use_rel_pos:
            index_h, index_w = getattr(self, "index_h", None), getattr(self, "index_w", None)
            if index_h is not None and index_h.shape[0] != height:
                index_h = None
            if index_w is not None and index_w.shape[0] != width:
                index_w = None
            bias = relative_position_bias(
                q, self.rel_pos_h, self.rel_pos_w, (height, width), index_h, index_w
            )
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        return self.proj(out.transpose(1, 2).reshape(batch, height, width, -1))


class WindowBlock(Block):
    """segment-anything's ``Block`` (same parameters and state dict) whose windowed attention
    output is copied once, back to rows; the padding is cut off as a view that the residual
    addition reads (segment-anything copies it a second time). ``[B, H, W, dim]`` in and out."""

    def forward(self, x: Tensor) -> Tensor:
        if self.window_size == 0:
            return super().forward(x)
        height, width = x.shape[1:3]
        size = self.window_size
        windows, (padded_h, padded_w) = window_partition(self.norm1(x), size)
        out = self.attn(windows)  # [B * windows, size, size, dim]
        grid = out.view(-1, padded_h // size, padded_w // size, size, size, out.shape[-1])
        rows = grid.permute(0, 1, 3, 2, 4, 5).reshape(-1, padded_h, padded_w, out.shape[-1])
        x = x + rows[:, :height, :width]
        return x + self.mlp(self.norm2(x))


def use_sdpa(encoder: nn.Module) -> nn.Module:
    """Make every segment-anything ``Attention`` in ``encoder`` an :class:`SDPAAttention` (with
    its relative-position index buffers) and every ``Block`` a :class:`WindowBlock` (in place:
    same parameters, same state dict). Returns ``encoder``."""
    for module in encoder.modules():
        if type(module) is Block:
            module.__class__ = WindowBlock
        if type(module) is Attention:
            module.__class__ = SDPAAttention
            if module.use_rel_pos:
                for axis, table in (("h", module.rel_pos_h), ("w", module.rel_pos_w)):
                    size = (table.shape[0] + 1) // 2
                    index = relative_index(size, table.device if not table.is_meta else None)
                    module.register_buffer(f"index_{axis}", index, persistent=False)
    return encoder
