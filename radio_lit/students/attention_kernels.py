"""Block-diagonal attention over a packed sequence, and the one place its kernel is chosen.

A packed sequence (:mod:`radio_lit.students.packing`) holds several images' tokens one after
another, ``[1, N, H, d]`` per head with ``N = sum(lengths)``; each image attends only to its
own tokens (NaViT, Dehghani et al. 2023: attention block-diagonal per image). Kernels:

- ``sdpa_mask``: ``F.scaled_dot_product_attention`` with a boolean block-diagonal mask
  ``[N, N]`` (any device; the CPU default: exact, and the mask is built once per forward);
- ``flex``: ``torch.nn.attention.flex_attention`` with a document mask (eager on CPU; compiled
  it is what KempnerForge #207 measured: 0.72x of padding at 512 tokens, 2.34x at 8k, H200);
- ``varlen``: ``torch.nn.attention.varlen.varlen_attn`` (CUDA only; flash or cuDNN inside);
- ``padded``: every image padded to the longest and SDPA with a key-padding mask (the baseline
  that packing has to beat: UniRL #40).

:func:`choose_kernel` picks one by device and head dim: on CPU ``sdpa_mask``; on CUDA the
fastest in a measured table (``benchmarks/packing.py`` on a GPU prints one) for the head dim,
else ``padded`` ``[choice]``: torch's ``varlen_attn`` runs cuDNN on compute capability 9-10
with cuDNN >= 9.18 (``torch.nn.attention.varlen._should_use_cudnn``, torch 2.14), which
pytorch #187770 measured 4.7x slower on one encoder and #191576 found without a backward for
some head dims (C-RADIOv4's are 72 and 80), and FlexAttention's document masks lose to padding
below ~1k tokens (KempnerForge #207): neither is the default without a measurement.
``model.student_packing.kernel`` overrides the choice; the choice is printed.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping, Sequence
from functools import cache
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

Kernel = Literal["sdpa_mask", "flex", "varlen", "padded"]
KERNELS: tuple[str, ...] = ("sdpa_mask", "flex", "varlen", "padded")
#: Kernels that need a CUDA device.
CUDA_ONLY = frozenset({"varlen"})


@cache
def available_kernels(device_type: str) -> frozenset[str]:
    """The kernels this torch build offers on ``device_type`` (``"cpu"``, ``"cuda"``)."""
    found = {"sdpa_mask", "padded"}
    if importlib.util.find_spec("torch.nn.attention.flex_attention") is not None:
        found.add("flex")
    if device_type == "cuda" and importlib.util.find_spec("torch.nn.attention.varlen"):
        found.add("varlen")
    return frozenset(found)


def choose_kernel(
    device_type: str,
    head_dim: int,
    override: str | None = None,
    measured: Mapping[int, Mapping[str, float]] | None = None,
    available: frozenset[str] | None = None,
) -> str:
    """The kernel for block-diagonal attention on ``device_type`` at ``head_dim``.

    Args:
        device_type: ``"cpu"`` or ``"cuda"``.
        head_dim: the attention head dim (C-RADIOv4: 80 for ViT-H/16, 72 for SO400M).
        override: a kernel name from the config; refused if this device lacks it.
        measured: per head dim, each kernel's measured throughput (tokens/s; larger is
            better), e.g. from ``benchmarks/packing.py --device cuda``. Only a measured kernel
            can win over the defaults.
        available: the kernels this build offers (default: :func:`available_kernels`).
    """
    offered = available_kernels(device_type) if available is None else available
    if override is not None:
        if override not in KERNELS:
            raise ValueError(
                f"unknown packed attention kernel {override!r}; pick one of {list(KERNELS)}"
            )
        if override not in offered:
            raise ValueError(
                f"packed attention kernel {override!r} is not available on {device_type} "
                f"(available: {sorted(offered)}); drop model.student_packing.kernel or pick one"
            )
        return override
    if device_type != "cuda":
        return "sdpa_mask"
    rates = {k: v for k, v in (measured or {}).get(head_dim, {}).items() if k in offered}
    if rates:
        return max(rates, key=lambda k: rates[k])
    return "padded"


def block_mask(lengths: Sequence[int], device: torch.device) -> Tensor:
    """``[N, N]`` boolean mask, True where query and key belong to the same image."""
    ids = torch.repeat_interleave(
        torch.arange(len(lengths), device=device), torch.tensor(list(lengths), device=device)
    )
    return ids[:, None] == ids[None, :]


def _flex(q: Tensor, k: Tensor, v: Tensor, lengths: Sequence[int]) -> Tensor:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    ids = torch.repeat_interleave(
        torch.arange(len(lengths), device=q.device), torch.tensor(list(lengths), device=q.device)
    )

    def same_image(b: Tensor, h: Tensor, qi: Tensor, ki: Tensor) -> Tensor:
        return ids[qi] == ids[ki]

    n = q.shape[-2]
    mask = create_block_mask(same_image, None, None, n, n, device=str(q.device))
    # Fused only when compiled (eager materializes the scores): compiled on CUDA.
    attend = _compiled_flex() if q.is_cuda else flex_attention
    return attend(q, k, v, block_mask=mask)  # type: ignore[return-value]


@cache
def _compiled_flex():  # type: ignore[no-untyped-def]
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention)


def _varlen(q: Tensor, k: Tensor, v: Tensor, lengths: Sequence[int]) -> Tensor:
    from torch.nn.attention.varlen import varlen_attn

    offsets = torch.tensor([0, *lengths], device=q.device).cumsum(0).to(torch.int32)
    longest = max(lengths)
    # varlen_attn takes [N, H, d]; the packed sequence is [1, H, N, d].
    out = varlen_attn(
        q[0].transpose(0, 1),
        k[0].transpose(0, 1),
        v[0].transpose(0, 1),
        offsets,
        offsets,
        longest,
        longest,
    )
    return out.transpose(0, 1).unsqueeze(0)


def _padded(q: Tensor, k: Tensor, v: Tensor, lengths: Sequence[int]) -> Tensor:
    longest = max(lengths)
    pieces = [t[0].split(list(lengths), dim=1) for t in (q, k, v)]  # each [H, n_i, d]
    batch = [
        torch.stack([F.pad(p, (0, 0, 0, longest - p.shape[1])) for p in group]) for group in pieces
    ]  # [B, H, L, d]
    valid = (
        torch.arange(longest, device=q.device)[None, :]
        < torch.tensor(list(lengths), device=q.device)[:, None]
    )
    out = F.scaled_dot_product_attention(*batch, attn_mask=valid[:, None, None, :])
    return torch.cat([o[:, :n] for o, n in zip(out, lengths, strict=True)], dim=1).unsqueeze(0)


def block_attention(
    q: Tensor, k: Tensor, v: Tensor, lengths: Sequence[int], kernel: str, mask: Tensor | None
) -> Tensor:
    """Attention of ``q, k, v [1, H, N, d]`` within each image (``lengths`` tokens each, in
    order) with ``kernel``; ``mask`` is :func:`block_mask` for ``sdpa_mask`` (built once per
    forward). Returns ``[1, H, N, d]``."""
    if kernel == "sdpa_mask":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    if kernel == "flex":
        return _flex(q, k, v, lengths)
    if kernel == "varlen":
        return _varlen(q, k, v, lengths)
    if kernel == "padded":
        return _padded(q, k, v, lengths)
    raise ValueError(f"unknown packed attention kernel {kernel!r}; pick one of {list(KERNELS)}")
