"""Per-model views of one shared crop (DESIGN.md, "One training step", step 2).

A batch arrives once as one random-resized crop per image, ``[B, 3, h, w]`` float in
``[0, 1]``. The student and every teacher get their own view of that crop, resized on the
device (kornia) to their own resolution and normalized with their own mean/std. Views are
never made by one global resize, so partitions and multi-resolution students plug in.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import kornia
import torch
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
    """Resize ``[B, 3, h, w]`` to ``size`` (side or ``(H, W)``) with antialiased bilinear."""
    hw = (size, size) if isinstance(size, int) else tuple(size)
    if tuple(crop.shape[-2:]) == hw:
        return crop
    if crop.device.type == "cpu":  # kornia's antialiasing blur is a depthwise convolution,
        crop = crop.contiguous(memory_format=torch.channels_last)  # 2x faster so in oneDNN
    view = kornia.geometry.transform.resize(crop, hw, interpolation="bilinear", antialias=True)
    return view.contiguous()


def normalize_view(view: Tensor, mean: Sequence[float], std: Sequence[float]) -> Tensor:
    """``(view - mean) / std`` per channel; ``view`` is ``[B, 3, H, W]`` in ``[0, 1]``."""
    mean_t = _channel_values(tuple(mean), view.dtype, view.device)
    std_t = _channel_values(tuple(std), view.dtype, view.device)
    return kornia.enhance.normalize(view, mean_t, std_t)


@functools.lru_cache(maxsize=128)
def _channel_values(values: tuple[float, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """``values`` as a tensor on ``device``, built once: a host-to-device copy of a Python list
    waits for the CUDA stream, so it must not happen at every step."""
    return torch.tensor(values, dtype=dtype, device=device)


def teacher_view(
    crop: Tensor, size: int | tuple[int, int], mean: Sequence[float], std: Sequence[float]
) -> Tensor:
    """The resized and normalized view ``[B, 3, H, W]`` of ``crop`` for one model."""
    return normalize_view(resize_view(as_float_images(crop), size), mean, std)
