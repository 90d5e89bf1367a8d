"""SAM2 and SAM3 image encoders from transformers as features-only teachers (C-RADIOv4
distills SAM3), fed by pad-and-crop or mosaics like SAM (:mod:`radio_lit.teachers.canvas`).
Their own image processors resize rather than pad, so a view smaller than the canvas shows
them zero bands they never saw in training: a declared convention (see that module).

Both are taken *before* their FPN neck, as RADIO does for SAM (AM-RADIO 3.4) and for SAM3
(NVlabs/RADIO #175: C-RADIOv4 distills SAM3's features before the neck): the neck only
re-projects the trunk's features to 256 channels for the mask decoder.
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import Tensor, nn
from transformers import AutoConfig, PretrainedConfig, Sam2VisionConfig, Sam3VisionConfig

from radio_lit.teachers.canvas import CanvasTeacher
from radio_lit.teachers.loading import TeacherDtype, cast, download_errors, torch_dtype
from radio_lit.teachers.speed import TeacherSpeed
from radio_lit.teachers.transformers_teacher import (
    LOCAL_HINT,
    PIXEL_STATS,
    is_model_type,
    square_side,
    transformers_class,
)


class _HFCanvasTeacher(CanvasTeacher):
    """A transformers SAM-family vision encoder on a fixed canvas; subclasses say which."""

    #: names in ``transformers`` (:func:`transformers_class`: imported when built)
    full_model: ClassVar[str]
    vision_model: ClassVar[str]
    vision_config: ClassVar[type[PretrainedConfig]]

    def _load(
        self, model: str, pretrained: bool, overrides: dict[str, Any], dtype: TeacherDtype | None
    ) -> nn.Module:
        """The vision encoder of ``model``: an id / directory of the full model (its
        ``vision_encoder``) or of the vision model alone, or a random one of the vision
        model type (``pretrained=False``)."""
        name = type(self).__name__
        full_model = transformers_class(self.full_model)
        vision_model = transformers_class(self.vision_model)
        vision_type = self.vision_config.model_type
        full_type = full_model.config_class.model_type
        if is_model_type(model):
            if model != vision_type or pretrained:
                raise ValueError(
                    f"{name}: give an HF id or a local directory, or model {vision_type!r} "
                    "with pretrained: false for random weights."
                )
            return cast(vision_model(self.vision_config(**overrides)), dtype)
        with download_errors(name, model, LOCAL_HINT):
            kind = AutoConfig.from_pretrained(model).model_type
            if kind not in (full_type, vision_type):
                raise ValueError(f"{model!r} is a {kind!r} model; {name} runs {full_type} models.")
            if not pretrained:
                config = self.vision_config.from_pretrained(model, **overrides)
                return cast(vision_model(config), dtype)
            if kind == vision_type:
                return vision_model.from_pretrained(model, dtype=torch_dtype(dtype), **overrides)
            full = full_model.from_pretrained(model, dtype=torch_dtype(dtype))
            return full.vision_encoder


class SAM2Teacher(_HFCanvasTeacher):
    """Frozen SAM2 Hiera image encoder (transformers ``Sam2VisionModel``), no summary.

    Reference models: ``facebook/sam2.1-hiera-large`` (also ``-base-plus``, ``-small``,
    ``-tiny``), 1024 px inputs.

    Which level: Hiera is hierarchical (4 stages at strides 4, 8, 16, 32), so "the features
    before the neck" are four maps. The teacher takes stage ``level`` (default 2, stride 16):
    it ends the deepest stage (most of Hiera's blocks, e.g. 36 of 48 in Hiera-L), its grid is
    SAM's and a ViT/16 student's (64x64 at 1024 px), and it is the level whose neck output is
    SAM2's image embedding for the mask decoder. Stage 3 (stride 32) is coarser than any
    student grid; stages 0-1 are early features.

    Outputs for a view ``[B, 3, H, W]`` (``H, W <= 1024``, multiples of the level's stride):
    ``features [B, H/s, W/s, C_level]`` via pad-and-crop or mosaics, ``summary=None``.

    Args:
        model: an HF id or directory of a SAM2 model (``sam2``: its ``vision_encoder`` is
            kept) or of a ``sam2_vision_model``; with ``pretrained=False``, the model type
            ``"sam2_vision_model"`` built from ``model_kwargs`` (tests).
        pretrained: load the weights.
        level: Hiera stage whose output is taken (0-3), see above.
        resolution: side of the view, at most the encoder's input size (default).
        model_kwargs: ``Sam2VisionConfig`` overrides (``backbone_config``...).
        follow_student: take the student's view size instead of ``resolution``.
        mosaic: pack ``k x k`` views per encoder input (RADIOv2.5 4.3).
        dtype: teacher precision; outputs stay float32.
        channels_last: convolution weights and views in channels-last memory format
            (:meth:`~radio_lit.teachers.Teacher.freeze`; docs/teachers.md). [choice]
        speed: compile, FP8 and attention-backend options of the encoder
            (:class:`~radio_lit.teachers.speed.TeacherSpeed`; docs/speed.md).
    """

    full_model = "Sam2Model"
    vision_model = "Sam2VisionModel"
    vision_config = Sam2VisionConfig

    def __init__(
        self,
        model: str,
        pretrained: bool = True,
        level: int = 2,
        resolution: int | None = None,
        model_kwargs: dict[str, Any] | None = None,
        follow_student: bool = False,
        mosaic: bool = False,
        dtype: TeacherDtype | None = None,
        channels_last: bool = False,
        speed: TeacherSpeed | None = None,
    ) -> None:
        encoder = self._load(model, pretrained, dict(model_kwargs or {}), dtype)
        hiera = encoder.config.backbone_config
        stages = len(hiera.blocks_per_stage)
        if not 0 <= level < stages:
            raise ValueError(f"SAM2Teacher level {level} is no Hiera stage; use 0 to {stages - 1}.")
        canvas = square_side(hiera.image_size)
        stride = square_side(hiera.patch_stride) * square_side(hiera.query_stride) ** min(
            level, hiera.num_query_pool_stages
        )
        mean, std = PIXEL_STATS["sam2_vision_model"]
        super().__init__(resolution or canvas, canvas, stride, mean, std, follow_student, mosaic)
        self.level = level
        self.model = encoder.backbone  # the neck is not run
        self._feature_dim = hiera.embed_dim_per_stage[level]
        self.freeze(channels_last, speed)

    @property
    def feature_dim(self) -> int:
        return self._feature_dim

    def encode_canvas(self, images: Tensor) -> Tensor:
        """``[B, 3, S, S]`` -> stage ``level``'s output ``[B, S/s, S/s, C_level]``."""
        return self.model(pixel_values=images).intermediate_hidden_states[self.level]


class SAM3Teacher(_HFCanvasTeacher):
    """Frozen SAM3 ViT image encoder (transformers ``Sam3VisionModel``), no summary.

    Reference model: ``facebook/sam3`` (gated; 1008 px inputs, 14 px patches, width 1024,
    windowed attention with 4 global blocks, RoPE). C-RADIOv4 distills it.

    The features are the ViT backbone's last layer, before the FPN neck (NVlabs/RADIO #175);
    the position table is tiled, not interpolated, so views are padded to the 1008 px canvas
    (or packed into mosaics) as for SAM.

    Outputs for a view ``[B, 3, H, W]`` (``H, W <= 1008``, multiples of 14):
    ``features [B, H/14, W/14, 1024]``, ``summary=None``.

    Args:
        model: an HF id or directory of a SAM3 model (``sam3``: its ``vision_encoder`` is
            kept) or of a ``sam3_vision_model``; with ``pretrained=False``, the model type
            ``"sam3_vision_model"`` built from ``model_kwargs`` (tests).
        pretrained: load the weights.
        resolution: side of the view, at most the encoder's input size (default).
        model_kwargs: ``Sam3VisionConfig`` overrides (``backbone_config``...).
        follow_student: take the student's view size instead of ``resolution``.
        mosaic: pack ``k x k`` views per encoder input (RADIOv2.5 4.3).
        dtype: teacher precision; outputs stay float32.
        channels_last: convolution weights and views in channels-last memory format
            (:meth:`~radio_lit.teachers.Teacher.freeze`; docs/teachers.md). [choice]
        speed: compile, FP8 and attention-backend options of the encoder
            (:class:`~radio_lit.teachers.speed.TeacherSpeed`; docs/speed.md).
    """

    full_model = "Sam3Model"
    vision_model = "Sam3VisionModel"
    vision_config = Sam3VisionConfig

    def __init__(
        self,
        model: str,
        pretrained: bool = True,
        resolution: int | None = None,
        model_kwargs: dict[str, Any] | None = None,
        follow_student: bool = False,
        mosaic: bool = False,
        dtype: TeacherDtype | None = None,
        channels_last: bool = False,
        speed: TeacherSpeed | None = None,
    ) -> None:
        encoder = self._load(model, pretrained, dict(model_kwargs or {}), dtype)
        vit = encoder.config.backbone_config
        canvas, patch = square_side(vit.image_size), square_side(vit.patch_size)
        mean, std = PIXEL_STATS["sam3_vision_model"]
        super().__init__(resolution or canvas, canvas, patch, mean, std, follow_student, mosaic)
        self.model = encoder.backbone  # the FPN neck is not run
        self._feature_dim = vit.hidden_size
        self.freeze(channels_last, speed)

    @property
    def feature_dim(self) -> int:
        return self._feature_dim

    def encode_canvas(self, images: Tensor) -> Tensor:
        """``[B, 3, S, S]`` -> backbone tokens ``[B, S/14, S/14, C]``."""
        tokens = self.model(pixel_values=images).last_hidden_state
        side = images.shape[-1] // self.patch_size
        return tokens.reshape(len(images), side, side, -1)
