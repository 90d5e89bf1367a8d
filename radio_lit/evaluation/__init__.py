"""What the student learned: kNN and zero-shot classification through the summary, PCA images of
features, mode switching and scale equivariance across resolutions, RankMe, the
reconstruction error of output token merging, and linear-probe segmentation (mIoU); the share
of a teacher's fixed-pattern noise the student reproduces (:class:`FixedPatternProbe`, logged
with the validation metrics).

Each measure is a Lightning callback (:class:`Evaluation`) that runs every N steps and at the
end of ``fit``, at the end of ``radio-lit validate`` / ``test``, and from ``radio-lit evaluate``
on a checkpoint; each evaluates a :class:`ModelView` (images in ``[0, 1]`` -> backbone and
teacher outputs), so a training module and an exported model are measured alike.
"""

from radio_lit.evaluation.base import Evaluation, Report, write_report
from radio_lit.evaluation.data import SAMPLE_CLASSES, LabeledImageFolder, SampleImageClasses
from radio_lit.evaluation.fixed_pattern import FixedPatternProbe
from radio_lit.evaluation.knn import KNNClassification, knn_votes
from radio_lit.evaluation.pca import PCAColors, PCAFeatureImages, pca_image
from radio_lit.evaluation.rank import RankMe, rank_me
from radio_lit.evaluation.resolution import ModeSwitching, ScaleEquivariance, scale_variance
from radio_lit.evaluation.segmentation import (
    LinearSegmentationHead,
    SegmentationProbe,
    miou_metric,
)
from radio_lit.evaluation.segmentation_data import (
    SAMPLE_SEGMENTATION,
    SampleSegmentation,
    SegmentationFolder,
    write_segmentation_folder,
)
from radio_lit.evaluation.token_merging import TokenMerging
from radio_lit.evaluation.upsampler_images import UpsamplerImages
from radio_lit.evaluation.view import BACKBONE, ModelView, module_view
from radio_lit.evaluation.zero_shot import ZeroShotClassification, zero_shot_weights

__all__ = [
    "BACKBONE",
    "SAMPLE_CLASSES",
    "SAMPLE_SEGMENTATION",
    "Evaluation",
    "FixedPatternProbe",
    "KNNClassification",
    "LabeledImageFolder",
    "LinearSegmentationHead",
    "ModeSwitching",
    "ModelView",
    "PCAColors",
    "PCAFeatureImages",
    "RankMe",
    "Report",
    "SampleImageClasses",
    "SampleSegmentation",
    "ScaleEquivariance",
    "SegmentationFolder",
    "SegmentationProbe",
    "TokenMerging",
    "UpsamplerImages",
    "ZeroShotClassification",
    "knn_votes",
    "miou_metric",
    "module_view",
    "pca_image",
    "rank_me",
    "scale_variance",
    "write_report",
    "write_segmentation_folder",
    "zero_shot_weights",
]
