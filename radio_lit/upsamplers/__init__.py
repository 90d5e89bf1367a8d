"""Feature upsamplers of frozen teachers: FeatSharp (arXiv 2502.16025) and its training.

A layer of its own, above ``teachers`` (it runs them, and :class:`UpsampledTeacher` is one)
and below ``training``. The parts are swappable in YAML by ``class_path`` / ``init_args``.
"""

from radio_lit.upsamplers.debias import BiasBuffer
from radio_lit.upsamplers.downsampler import AttentionDownsampler
from radio_lit.upsamplers.featsharp import FeatSharp
from radio_lit.upsamplers.fusion import FusionBlock, NeighbourhoodAttention, TileEmbedding
from radio_lit.upsamplers.jbu import JBUStack, JBUStage
from radio_lit.upsamplers.module import FeatSharpModule
from radio_lit.upsamplers.objective import Uncertainty, consistency_loss, seam_weights
from radio_lit.upsamplers.passes import TeacherPasses, teacher_passes
from radio_lit.upsamplers.teacher import UpsampledTeacher
from radio_lit.upsamplers.views import JitteredViews, cell_matrix, warp_cells

__all__ = [
    "AttentionDownsampler",
    "BiasBuffer",
    "FeatSharp",
    "FeatSharpModule",
    "FusionBlock",
    "JBUStack",
    "JBUStage",
    "JitteredViews",
    "NeighbourhoodAttention",
    "TeacherPasses",
    "TileEmbedding",
    "Uncertainty",
    "UpsampledTeacher",
    "cell_matrix",
    "consistency_loss",
    "seam_weights",
    "teacher_passes",
    "warp_cells",
]
