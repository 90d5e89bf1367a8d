"""SAM image-encoder teacher with pad-and-crop or mosaic views (AM-RADIO 3.4 and 4, PHI-S
section 3, RADIOv2.5 4.3).

SAM gives dense features only (no summary). They are taken before the neck, i.e. the last
block's output, as AM-RADIO does. SAM's encoder has absolute position embeddings for one input
size, and downsampling its features degrades them (PHI-S section 3), so a smaller view is
zero-padded bottom/right to the encoder's size and the features of the unpadded region are
cropped out, never interpolated; or, with ``mosaic``, ``k x k`` views share one encoder input
(:mod:`radio_lit.teachers.mosaic`).
"""

from __future__ import annotations

import warnings
from typing import Any, Literal

from segment_anything import sam_model_registry
from segment_anything.modeling import ImageEncoderViT
from torch import Tensor, nn

from radio_lit.teachers._errors import require_file, unknown_name
from radio_lit.teachers.canvas import CanvasTeacher
from radio_lit.teachers.loading import (
    TeacherDtype,
    assign_weights,
    build_on_meta,
    cast,
    read_state_dict,
)
from radio_lit.teachers.sam_attention import use_sdpa
from radio_lit.teachers.speed import TeacherSpeed

#: SAM's pixel normalization (``Sam.pixel_mean`` / ``pixel_std``) on the 0-1 scale.
SAM_MEAN = (123.675 / 255, 116.28 / 255, 103.53 / 255)
SAM_STD = (58.395 / 255, 57.12 / 255, 57.375 / 255)

#: SAM model types with official weights.
SAM_MODEL_TYPES = ("vit_b", "vit_l", "vit_h")

_GET_WEIGHTS = (
    "Download the official SAM weights (sam_vit_h_4b8939.pth, sam_vit_l_0b3195.pth, "
    "sam_vit_b_01ec64.pth) from https://github.com/facebookresearch/segment-anything"
    "#model-checkpoints and pass the file's path as checkpoint."
)


class SAMTeacher(CanvasTeacher):
    """Frozen SAM ViTDet image encoder; features before the neck, no summary.

    AM-RADIO section 4 distills SAM ViT-H at 1024 px. A view ``[B, 3, H, W]`` with
    ``H, W <= img_size`` is padded to ``[B, 3, img_size, img_size]``; the output is
    ``features`` ``[B, H/16, W/16, C]`` (the top-left cells of the encoder's grid) and
    ``summary=None``. With ``mosaic``, square views of side ``R`` are packed ``k x k``
    (``k = img_size // R``) into each encoder input (RADIOv2.5 4.3): ``ceil(B / k^2)``
    forwards instead of ``B``, the same output shape. Its features are never interpolated
    (``interpolatable = False``): the loss uses SAM's grid.

    Give exactly one of ``model_type`` (SAM's architecture, built by
    ``segment_anything.sam_model_registry``) or ``encoder_kwargs`` (a custom
    ``ImageEncoderViT``, e.g. a tiny one for tests).

    Args:
        model_type: ``"vit_b"``, ``"vit_l"`` or ``"vit_h"``.
        checkpoint: SAM checkpoint file (the official ``sam_vit_*.pth`` or any state dict with
            ``image_encoder.*`` keys); the encoder is then built on the meta device and the
            file's tensors assigned. ``None`` leaves random weights (tests, benchmarks).
        resolution: side of the view in pixels, at most the encoder's ``img_size`` (default).
        encoder_kwargs: keyword arguments of ``segment_anything.modeling.ImageEncoderViT``.
        follow_student: take the student's view (side ``student grid x 16``) instead of
            ``resolution``, e.g. for a multi-resolution student; it must fit in ``img_size``.
        mosaic: pack ``k x k`` views per encoder input (RADIOv2.5 4.3) instead of padding
            each view alone.
        dtype: teacher precision (``bfloat16`` halves its memory; outputs stay float32).
        channels_last: convolution weights and views in channels-last memory format
            (:meth:`~radio_lit.teachers.Teacher.freeze`; docs/teachers.md). [choice]
        speed: compile, FP8 and attention-backend options of the encoder
            (:class:`~radio_lit.teachers.speed.TeacherSpeed`; docs/speed.md).
    """

    def __init__(
        self,
        model_type: Literal["vit_b", "vit_l", "vit_h"] | None = None,
        checkpoint: str | None = None,
        resolution: int | None = None,
        encoder_kwargs: dict[str, Any] | None = None,
        follow_student: bool = False,
        mosaic: bool = False,
        dtype: TeacherDtype | None = None,
        channels_last: bool = False,
        speed: TeacherSpeed | None = None,
    ) -> None:
        if checkpoint is not None:
            encoder = build_on_meta(lambda: _build_encoder(model_type, encoder_kwargs))
            _load_encoder_weights(encoder, checkpoint)
        else:
            encoder = _build_encoder(model_type, encoder_kwargs)
            if model_type is not None:
                warnings.warn(
                    f"SAMTeacher({model_type!r}) has random weights. {_GET_WEIGHTS}", stacklevel=2
                )
        patch = encoder.patch_embed.proj.kernel_size[0]
        super().__init__(
            resolution or encoder.img_size,
            encoder.img_size,
            patch,
            SAM_MEAN,
            SAM_STD,
            follow_student,
            mosaic,
        )
        encoder.neck = nn.Identity()  # features are taken before the neck
        use_sdpa(encoder)  # relative positions as SDPA's additive mask: the same outputs
        self.model = cast(encoder, dtype)
        self._feature_dim = encoder.patch_embed.proj.out_channels
        self.freeze(channels_last, speed)

    @property
    def feature_dim(self) -> int:
        return self._feature_dim

    def encode_canvas(self, images: Tensor) -> Tensor:
        """``[B, 3, img_size, img_size]`` -> last block's tokens ``[B, img/16, img/16, C]``."""
        return self.model(images).permute(0, 2, 3, 1)


def _build_encoder(
    model_type: str | None, encoder_kwargs: dict[str, Any] | None
) -> ImageEncoderViT:
    """SAM's image encoder of ``model_type``, or one built from ``encoder_kwargs``."""
    if (model_type is None) == (encoder_kwargs is None):
        raise ValueError(
            "SAMTeacher needs exactly one of model_type (vit_b / vit_l / vit_h) or "
            "encoder_kwargs (a custom ImageEncoderViT)."
        )
    if encoder_kwargs is not None:
        return ImageEncoderViT(**encoder_kwargs)
    if model_type not in SAM_MODEL_TYPES:
        raise unknown_name(
            "SAM model type",
            model_type,
            SAM_MODEL_TYPES,
            f"Valid types: {', '.join(SAM_MODEL_TYPES)}.",
        )
    return sam_model_registry[model_type]().image_encoder


def _load_encoder_weights(encoder: ImageEncoderViT, checkpoint: str) -> None:
    """Assign the ``image_encoder.*`` entries of a SAM checkpoint to the meta-built ``encoder``
    (strict)."""
    file = require_file(checkpoint, "SAM checkpoint", _GET_WEIGHTS)
    state = read_state_dict(file)
    prefix = "image_encoder."
    encoder_state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    if not encoder_state:
        raise ValueError(f"{str(file)!r} has no image_encoder.* weights; is it a SAM checkpoint?")
    assign_weights(encoder, encoder_state)
