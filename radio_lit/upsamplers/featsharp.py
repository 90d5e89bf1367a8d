"""FeatSharp: a teacher's feature map upsampled ``k`` times (FeatSharp paper, arXiv 2502.16025,
ICML 2025, section 3; notes 4.2-4.3).

From the frozen teacher's low-resolution pass and its ``k x k`` tile pass
(:func:`~radio_lit.upsamplers.passes.teacher_passes`), both normalized (PHI-S) and de-biased
(:class:`~radio_lit.upsamplers.debias.BiasBuffer`): the low-resolution map upsampled by an
image-guided base upsampler (:class:`~radio_lit.upsamplers.jbu.JBUStack`), the tile map with
its tile code (:class:`~radio_lit.upsamplers.fusion.TileEmbedding`), fused by one local
attention block that keeps the base path's channels
(:class:`~radio_lit.upsamplers.fusion.FusionBlock`). The output lives in the teacher's
normalized space; :meth:`FeatSharp.denormalize` maps it back to the teacher's.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import Tensor, nn

from radio_lit.core.outputs import TeacherOutput
from radio_lit.data.views import as_float_images
from radio_lit.normalizers import Normalizer, PhiS
from radio_lit.teachers import Teacher
from radio_lit.upsamplers.debias import BiasBuffer
from radio_lit.upsamplers.fusion import FusionBlock, TileEmbedding
from radio_lit.upsamplers.jbu import JBUStack
from radio_lit.upsamplers.passes import teacher_passes

__all__ = ["FeatSharp"]

#: ``(dim, factor) -> module``: base upsampler, ``[B, C, h, w]`` + image -> ``[B, C, k h, k w]``.
BaseFactory = Callable[[int, int], nn.Module]
#: ``dim -> module``: the fusion block, ``(base, tiles)`` ``[B, H, W, C]`` -> ``[B, H, W, C]``.
FusionFactory = Callable[[int], nn.Module]
#: ``dim -> normalizer`` of the teacher's features (``radio_lit.normalizers``).
NormalizerFactory = Callable[[int], Normalizer]


class FeatSharp(nn.Module):
    """The upsampler of one teacher's features (module docstring).

    Args:
        dim: the teacher's feature channels ``C``.
        grid: the teacher's token grid ``(h, w)`` at its native resolution (the bias's).
        factor: upsampling factor ``k`` (C-RADIOv4: 3, SigLIP2-g 24x24 -> 72x72).
        base: the image-guided base upsampler (default :class:`JBUStack`, the paper's).
        fusion: the fusion block (default :class:`FusionBlock`).
        normalizer: the teacher's normalized space (default PHI-S, as the paper's); its
            statistics are estimated first (``radio_lit.callbacks.TeacherStatsEstimation``).
        tile_code: the learned tile positional code [paper: on].
    """

    def __init__(
        self,
        dim: int,
        grid: tuple[int, int],
        factor: int = 3,
        base: BaseFactory = JBUStack,
        fusion: FusionFactory = FusionBlock,
        normalizer: NormalizerFactory = PhiS,
        tile_code: bool = True,
    ) -> None:
        super().__init__()
        if factor < 2:
            raise ValueError(f"FeatSharp: factor must be at least 2, got {factor}")
        self.dim, self.grid, self.factor = dim, tuple(grid), factor
        self.normalizer = normalizer(dim)
        self.bias = BiasBuffer(dim, self.grid)
        self.base = base(dim, factor)
        self.tile_code = TileEmbedding(dim, factor) if tile_code else None
        self.fusion = fusion(dim)

    def prepare(self, features: Tensor, tiles: int = 1) -> Tensor:
        """Teacher features ``[B, H, W, C]`` normalized and de-biased (``tiles = k``: a
        stitched tile map, each tile de-biased): what the upsampler and the objective see."""
        return self.bias(self.normalizer(features.float()), tiles)

    def forward(self, low: Tensor, tiles: Tensor, image: Tensor) -> Tensor:
        """The upsampled map ``[B, k h, k w, C]`` in the normalized space.

        Args:
            low: ``[B, h, w, C]`` the teacher's low-resolution pass (teacher space).
            tiles: ``[B, k h, k w, C]`` its stitched tile pass (teacher space).
            image: ``[B, 3, H', W']`` in ``[0, 1]``, the guidance image.
        """
        low = self.prepare(low)
        tiles = self.prepare(tiles, self.factor)
        base = self.base(low.permute(0, 3, 1, 2), image).permute(0, 2, 3, 1)
        if self.tile_code is not None:
            tiles = self.tile_code(tiles)
        return self.fusion(base, tiles)

    def denormalize(self, features: Tensor) -> Tensor:
        """Normalized ``[..., C]`` -> the teacher's space (the normalizer's inverse)."""
        return self.normalizer.inverse(features)

    def upsample(self, teacher: Teacher, images: Tensor, denormalize: bool = True) -> TeacherOutput:
        """``teacher``'s ``k``-times map of ``images [B, 3, S, S]`` (uint8 or ``[0, 1]``): the
        summary of its low-resolution pass, features ``[B, k h, k w, C]`` in the teacher's
        space (or the normalized one without ``denormalize``)."""
        passes = teacher_passes(teacher, images, self.factor)
        features = self(passes.low, passes.tiles, as_float_images(images))
        if denormalize:
            features = self.denormalize(features)
        return TeacherOutput(passes.summary, features)
