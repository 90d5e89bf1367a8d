"""Mosaic augmentation for SAM (RADIOv2.5 section 4.3, supplement J).

Training a student at a small resolution ``s`` against SAM (fixed input ``S = 1024``) with
pad-and-crop spends most of SAM's forward on padding (15/16 of the pixels at 256 px). A mosaic
packs ``k x k`` student-resolution views, each padded to a tile of ``S / k`` pixels, into one
``S x S`` image; SAM runs once on it and each view's feature map is cut back out. A view then
costs ``1 / k^2`` SAM forwards: ``k = 4`` (no padding) at 256 px, ``k = 2`` with 80 px padding
per tile at 432 px (the paper's examples), ``k = 1`` (plain pad-and-crop) at 1024 px.

Each view sits at the top-left of its tile, so it starts on a patch boundary and its features
are exactly the cells its pixels fall in; padding is zero in the normalized space (SAM's mean
pixel), as in pad-and-crop.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class MosaicLayout:
    """How views of side ``side`` are packed into a ``canvas x canvas`` image.

    Attributes:
        side: view side in pixels (a multiple of ``patch``).
        canvas: the encoder's input side in pixels.
        patch: pixels per feature cell.
        k: views per mosaic row and column (``k x k`` views per mosaic).
        tile: pixels per tile side (``side`` plus padding), a multiple of ``patch``.
    """

    side: int
    canvas: int
    patch: int
    k: int
    tile: int

    @property
    def per_mosaic(self) -> int:
        """Views per mosaic, ``k^2``."""
        return self.k * self.k

    @property
    def padding(self) -> int:
        """Padding pixels per tile side (80 for 432 px views in 1024 px mosaics)."""
        return self.tile - self.side

    def mosaics(self, views: int) -> int:
        """Encoder inputs needed for ``views`` views: ``ceil(views / k^2)``."""
        return math.ceil(views / self.per_mosaic)


def mosaic_layout(side: int, canvas: int, patch: int) -> MosaicLayout:
    """The densest layout: ``k = canvas // side`` views per row, tiles of
    ``(canvas // k)`` pixels rounded down to whole patches.

    Raises:
        ValueError: ``side`` is not a multiple of ``patch`` or exceeds ``canvas``.
    """
    if side % patch or not 0 < side <= canvas:
        raise ValueError(
            f"a mosaic view must be a positive multiple of the patch size {patch} of at most "
            f"{canvas} px, got {side} px"
        )
    k = canvas // side
    tile = canvas // k // patch * patch
    return MosaicLayout(side=side, canvas=canvas, patch=patch, k=k, tile=tile)


def pack(views: Tensor, layout: MosaicLayout) -> Tensor:
    """Pack ``views [B, 3, s, s]`` into mosaics ``[ceil(B / k^2), 3, canvas, canvas]``.

    View ``i`` goes to mosaic ``i // k^2``, row ``(i % k^2) // k``, column ``i % k``; unused
    tiles of the last mosaic and all padding are zeros.
    """
    batch, channels = views.shape[:2]
    k, tile = layout.k, layout.tile
    pad = layout.padding
    count = layout.mosaics(batch)
    missing = count * layout.per_mosaic - batch
    if pad or missing:  # one pass: each view to its tile, empty tiles for the last mosaic
        views = F.pad(views, (0, pad, 0, pad, 0, 0, 0, missing))  # [count * k^2, 3, tile, tile]
    grid = views.reshape(count, k, k, channels, tile, tile).permute(0, 3, 1, 4, 2, 5)
    mosaics = grid.reshape(count, channels, k * tile, k * tile)
    rest = layout.canvas - k * tile
    return F.pad(mosaics, (0, rest, 0, rest)) if rest else mosaics


def unpack(features: Tensor, layout: MosaicLayout, views: int) -> Tensor:
    """Cut each view's features out of the mosaics' feature maps.

    Args:
        features: ``[M, G, G, C]`` encoder features of the mosaics (``G = canvas / patch``).
        layout: the layout :func:`pack` used.
        views: number of views packed (``B``).

    Returns:
        ``[B, s / patch, s / patch, C]``, view ``i``'s cells in :func:`pack`'s order.
    """
    count, _, _, channels = features.shape
    k, cells = layout.k, layout.tile // layout.patch
    used = features[:, : k * cells, : k * cells]
    per_view = used.reshape(count, k, cells, k, cells, channels).permute(0, 1, 3, 2, 4, 5)
    per_view = per_view.reshape(count * k * k, cells, cells, channels)[:views]
    side = layout.side // layout.patch
    return per_view[:, :side, :side]
