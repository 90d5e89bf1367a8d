"""Per-model views of one shared crop (DESIGN.md, "One training step", step 2).

A batch arrives once as one random-resized crop per image, ``[B, 3, h, w]`` float in
``[0, 1]``. The student and every teacher get their own view of that crop, resized on the
device to their own resolution (antialiased bilinear, PIL's triangle filter: one
``F.interpolate`` kernel) and normalized with their own mean/std. Views are never made by one
global resize, so partitions and multi-resolution students plug in.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def as_float_images(images: Tensor) -> Tensor:
    """``[B, 3, H, W]`` uint8 in ``[0, 255]`` or float in ``[0, 1]`` -> float32 in ``[0, 1]``."""
    if images.ndim != 4 or images.shape[1] != 3:
        raise ValueError(
            f"expected images shaped [B, 3, H, W], got {tuple(images.shape)}; "
            "convert grayscale/RGBA images to RGB in the dataset"
        )
    if images.dtype == torch.uint8:
        return images.float().div_(255.0)
    if not images.is_floating_point():
        raise TypeError(f"images must be uint8 or floating point, got {images.dtype}")
    return images


def resize_view(crop: Tensor, size: int | tuple[int, int]) -> Tensor:
    """Resize ``[B, 3, h, w]`` to ``size`` (side or ``(H, W)``) with antialiased bilinear.

    ``F.interpolate(..., antialias=True)``: along a shrinking axis the triangle filter is
    widened by the scale factor (PIL's and torchvision's antialiased bilinear, as the
    teachers' own PIL preprocessing resizes), along a growing axis it is plain bilinear;
    one kernel, no host reads. [choice] (Earlier versions used kornia's Gaussian blur, then
    bilinear: on the shipped photographs the two differ by 0.005-0.007 mean absolute pixel
    value in ``[0, 1]``, and this filter is 6x closer to PIL's; benchmarks/README.md.)

    On a CPU a bfloat16 or float16 map is resized in float32 and cast back: PyTorch's CPU
    antialiased kernel has no half-precision version (``precision: bf16-mixed`` on a CPU).
    """
    hw = (size, size) if isinstance(size, int) else tuple(size)
    if tuple(crop.shape[-2:]) == hw:
        return crop
    half = crop.device.type == "cpu" and crop.dtype in (torch.bfloat16, torch.float16)
    resized = F.interpolate(
        crop.float() if half else crop,
        size=hw,
        mode="bilinear",
        align_corners=False,
        antialias=True,
    )
    return resized.to(crop.dtype) if half else resized


def normalize_view(view: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """``(view - mean) / std`` per channel; ``view`` is ``[B, 3, H, W]`` in ``[0, 1]``.

    One operation, ``view * (1 / std) + (-mean / std)`` (``torch.addcmul``; equal to the
    subtraction and division up to float rounding, a few 1e-7)."""
    scale, shift = _channel_affine(tuple(mean), tuple(std), view.dtype, view.device)
    return torch.addcmul(shift, view, scale)


@functools.lru_cache(maxsize=128)
def _channel_affine(
    mean: tuple[float, ...], std: tuple[float, ...], dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor]:
    """``(1 / std, -mean / std)`` as ``[1, C, 1, 1]`` tensors on ``device``, built once: a
    host-to-device copy of a Python list waits for the CUDA stream, so it must not happen at
    every step."""
    scale = [1.0 / s for s in std]
    shift = [-m / s for m, s in zip(mean, std, strict=True)]

    def channels(values: list[float]) -> Tensor:
        return torch.tensor(values, dtype=dtype, device=device).view(1, -1, 1, 1)

    return channels(scale), channels(shift)


def teacher_view(
    crop: Tensor, size: int | tuple[int, int], mean: Sequence[float], std: Sequence[float]
) -> Tensor:
    """The resized and normalized view ``[B, 3, H, W]`` of ``crop`` for one model."""
    return normalize_view(resize_view(as_float_images(crop), size), mean, std)
