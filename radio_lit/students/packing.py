"""Packed variable-resolution forwards: several resolutions' images in one student forward
(NaViT, Dehghani et al. 2023): every rank busy whatever its resolutions.

Each image's tokens (its summary tokens, registers, then its patches with its own CPE window,
:meth:`~radio_lit.students.CPEViT.embed`) are concatenated into one sequence ``[1, N, D]``,
``N = sum_i (P + h_i * w_i)``; the token-wise layers (norms, MLPs, projections) run once over
all of them, so the GEMMs are as large as the rank's whole batch, and attention is
block-diagonal per image (:mod:`radio_lit.students.attention_kernels`). ViTDet's windowed
blocks (:mod:`radio_lit.students.vitdet`) are block-diagonal too: each window of a windowed
image is its own block and that image's prefix tokens sit the block out, as in
:func:`~radio_lit.students.vitdet.run_windowed`; an image no window tiles attends globally.

The outputs equal one forward per batch (float tolerance: only summation orders differ), the
random draws included: each batch draws its CPE windows, dropout and ViTDet window in the order
one forward per batch would (``tests/students/test_packing.py``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from timm.models.vision_transformer import Attention, Block
from torch import Tensor, nn

from radio_lit.students.attention_kernels import (
    KERNELS,
    block_attention,
    block_mask,
    choose_kernel,
)
from radio_lit.students.base import StudentOutput
from radio_lit.students.vitdet import window_order


@dataclass
class _Layout:
    """Which tokens of the packed sequence a block sees (``index [M]``, ``None``: all, in
    order) and the lengths of its attention blocks (summing to ``M``)."""

    index: Tensor | None
    lengths: list[int]
    mask: Tensor | None = None


def _attend(attn: Attention, x: Tensor, layout: _Layout, kernel: str) -> Tensor:
    """timm's ``Attention.forward`` on ``[1, M, D]`` with block-diagonal attention."""
    batch, length, _ = x.shape
    qkv = attn.qkv(x).reshape(batch, length, 3, attn.num_heads, attn.head_dim)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    out = block_attention(q, k, v, layout.lengths, kernel, layout.mask)
    out = attn.norm(out.transpose(1, 2).reshape(batch, length, -1))
    if getattr(attn, "gate", None) is not None:
        out = out * attn.gate(x).sigmoid()
    return attn.proj_drop(attn.proj(out))


def _block(block: Block, x: Tensor, layout: _Layout, kernel: str) -> Tensor:
    """timm's ``Block.forward`` on the tokens ``layout`` selects of ``x [1, N, D]``."""
    part = x if layout.index is None else x[:, layout.index]
    part = part + block.ls1(_attend(block.attn, block.norm1(part), layout, kernel))
    part = part + block.ls2(block.mlp(block.norm2(part)))
    if layout.index is None:
        return part
    return x.index_copy(1, layout.index, part)


def packing_refusal(blocks: nn.Module, training: bool) -> str | None:
    """Why ``blocks`` cannot run packed (a one-line error naming the fix), or ``None``."""
    for i, block in enumerate(blocks):
        if type(block) is not Block or not isinstance(block.attn, Attention):
            return (
                f"student block {i} is a {type(block).__name__}: packing runs timm's plain "
                "ViT Block/Attention only; drop model.student_packing"
            )
        if training and not (
            isinstance(block.drop_path1, nn.Identity) and block.attn.attn_drop.p == 0.0
        ):
            return (
                f"student block {i} has drop_path or attention dropout, drawn per sample of a "
                "batch: set drop_path_rate and attn_drop_rate to 0 or drop model.student_packing"
            )
    return None


def packed_forward(student: Any, views: Sequence[Tensor], kernel: str) -> list[StudentOutput]:
    """``student`` (a :class:`~radio_lit.students.CPEViT`) on every batch of ``views``
    (``[B_i, 3, H_i, W_i]`` each) in one packed forward, attention by ``kernel``.

    Returns one :class:`StudentOutput` per batch (``summary [B_i, T, D]``,
    ``features [B_i, h_i, w_i, D]``), in order.
    """
    if not views:
        raise ValueError("packed forward of no image batches: pass at least one")
    refusal = packing_refusal(student.blocks, student.training)
    if refusal is not None:
        raise ValueError(refusal)
    num_prefix = student.num_cls_tokens + student.num_registers
    tokens, shapes, windows = [], [], []
    for images in views:
        x, hw = student.embed(images)  # draws as student(images) would, in the same order
        windows.append(student.vitdet_window(hw))
        tokens.append(x.reshape(1, -1, x.shape[-1]))
        shapes.append((x.shape[0], hw))
    x = student.norm_pre(torch.cat(tokens, dim=1))
    device = x.device
    whole, windowed = _layouts(shapes, windows, num_prefix, device)
    for layout in {id(whole): whole, id(windowed): windowed}.values():
        if kernel == "sdpa_mask":
            layout.mask = block_mask(layout.lengths, device)
    local = (
        student.windowed if any(w is not None for w in windows) else [False] * len(student.blocks)
    )
    for block, is_local in zip(student.blocks, local, strict=True):
        x = _block(block, x, windowed if is_local else whole, kernel)
    x = student.norm(x)[0]
    outputs, start = [], 0
    for batch, (h, w) in shapes:
        part = x[start : start + batch * (num_prefix + h * w)].reshape(
            batch, num_prefix + h * w, -1
        )
        start += part.shape[0] * part.shape[1]
        outputs.append(student.output(part, (h, w)))
    return outputs


def _layouts(
    shapes: list[tuple[int, tuple[int, int]]],
    windows: list[int | None],
    num_prefix: int,
    device: torch.device,
) -> tuple[_Layout, _Layout]:
    """The global blocks' layout (every image whole) and the windowed blocks' (each window of
    a windowed image a block, its prefix left out; other images whole)."""
    whole = [num_prefix + h * w for batch, (h, w) in shapes for _ in range(batch)]
    if all(w is None for w in windows):
        layout = _Layout(None, whole)
        return layout, layout
    index, lengths, start = [], [], 0
    for (batch, (h, w)), window in zip(shapes, windows, strict=True):
        size = num_prefix + h * w
        order = None if window is None else window_order(h, w, window, device) + num_prefix
        for _ in range(batch):
            if order is None:
                index.append(torch.arange(start, start + size, device=device))
                lengths.append(size)
            else:
                index.append(order + start)
                lengths += [window * window] * (h * w // (window * window))
            start += size
    return _Layout(None, whole), _Layout(torch.cat(index), lengths)


class StudentPacking:
    """``model.student_packing``: a rank's chunks of several resolutions (its partitions'
    images, or one partition's) run as one packed student forward (:func:`packed_forward`).

    Args:
        kernel: the block-diagonal attention kernel (``sdpa_mask``, ``flex``, ``varlen``,
            ``padded``); ``None``: chosen by device and head dim
            (:func:`~radio_lit.students.attention_kernels.choose_kernel`).
        measured: per head dim, each kernel's measured tokens/s on this run's GPU
            (``benchmarks/packing.py`` on a GPU prints it); the fastest wins on CUDA.

    The choice is printed once, at the first packed forward.
    """

    def __init__(
        self, kernel: str | None = None, measured: dict[int, dict[str, float]] | None = None
    ) -> None:
        if kernel is not None and kernel not in KERNELS:
            raise ValueError(f"unknown packed attention kernel {kernel!r}; pick one of {KERNELS}")
        self.kernel, self.measured = kernel, measured
        self.chosen: str | None = None

    def kernel_for(self, student: Any, device: torch.device) -> str:
        """The kernel for ``student``'s head dim on ``device``, chosen once and printed."""
        if self.chosen is None:
            head_dim = student.blocks[0].attn.head_dim
            self.chosen = choose_kernel(device.type, head_dim, self.kernel, self.measured)
            how = "configured" if self.kernel else "chosen by device and head dim"
            print(f"packed student attention: {self.chosen} ({how}: {device.type}, {head_dim})")
        return self.chosen
