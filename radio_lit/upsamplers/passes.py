"""The frozen teacher's two passes in one batched call (FeatSharp paper, arXiv 2502.16025, 3;
notes 4.2 steps 1-2).

For an upsampling factor ``k`` and a teacher of native resolution ``R``: the low-resolution
pass sees the whole image at ``R`` px, the tile pass the image at ``k R`` px cut into ``k x k``
tiles of ``R`` px, each encoded on its own and stitched back into a ``k h x k w`` map. Both go
through the teacher as one batch of ``B (1 + k²)`` views (``1 + k²`` teacher passes per image).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from radio_lit.data.views import as_float_images, resize_view
from radio_lit.teachers import Teacher

__all__ = ["TeacherPasses", "cut_tiles", "low_pass", "stitch_tiles", "teacher_passes"]


def cut_tiles(image: Tensor, factor: int) -> Tensor:
    """``[B, C, k H, k W]`` -> the ``k x k`` tiles ``[B k², C, H, W]`` (row-major per image)."""
    b, c, height, width = image.shape
    h, w = height // factor, width // factor
    tiles = image.reshape(b, c, factor, h, factor, w).permute(0, 2, 4, 1, 3, 5)
    return tiles.reshape(b * factor * factor, c, h, w)


def stitch_tiles(tiles: Tensor, factor: int) -> Tensor:
    """Tile features ``[B k², h, w, C]`` (row-major per image) -> the map ``[B, k h, k w, C]``."""
    n, h, w, c = tiles.shape
    grid = tiles.reshape(n // (factor * factor), factor, factor, h, w, c).permute(0, 1, 3, 2, 4, 5)
    return grid.reshape(n // (factor * factor), factor * h, factor * w, c)


@dataclass
class TeacherPasses:
    """The teacher's outputs for a batch of images.

    Attributes:
        summary: ``[B, C_s]`` from the low-resolution pass (FeatSharp does not change it), or
            ``None`` (a teacher without a summary).
        low: ``[B, h, w, C]`` the low-resolution pass's features.
        tiles: ``[B, k h, k w, C]`` the tile pass's features, stitched.
        extra: ``[N, h, w, C]`` the features of the ``extra`` views given along, or ``None``.
    """

    summary: Tensor | None
    low: Tensor
    tiles: Tensor
    extra: Tensor | None = None


def low_pass(teacher: Teacher, images: Tensor) -> Tensor:
    """The low-resolution pass alone: ``teacher``'s features ``[B, h, w, C]`` of ``images
    [B, 3, S, S]`` (uint8 or ``[0, 1]``) resized to its ``R`` px (what FeatSharp's normalizer
    is estimated on)."""
    side = teacher.resolution
    return teacher(resize_view(as_float_images(images), side), (side, side)).features


def teacher_passes(
    teacher: Teacher, images: Tensor, factor: int, extra: Tensor | None = None
) -> TeacherPasses:
    """The low-resolution and tile passes of ``teacher`` over ``images [B, 3, S, S]`` (uint8 or
    ``[0, 1]``), as one call of the teacher on ``B (1 + k²)`` views of ``R`` px (plus ``extra``
    views ``[N, 3, R', R']`` in ``[0, 1]``, resized to ``R``: the training views, in the same
    call). Views are resized with antialiasing (:func:`radio_lit.data.views.resize_view`)."""
    images = as_float_images(images)
    side = teacher.resolution
    views = [resize_view(images, side), cut_tiles(resize_view(images, factor * side), factor)]
    if extra is not None:
        views.append(resize_view(extra, side))
    out = teacher(torch.cat(views), (side, side))
    b, n = images.shape[0], images.shape[0] * factor * factor
    features = out.features
    return TeacherPasses(
        summary=None if out.summary is None else out.summary[:b],
        low=features[:b],
        tiles=stitch_tiles(features[b : b + n], factor),
        extra=None if extra is None else features[b + n :],
    )
