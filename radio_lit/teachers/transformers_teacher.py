"""Generic Hugging Face transformers ViT teacher: the token layout comes from the model's
output, patch size and input size from its config, pixel statistics from the checkpoint's
image processor config (``preprocessor_config.json``), else from its architecture.

``from_pretrained`` already builds on the meta device and assigns the checkpoint's tensors
(transformers' own low-memory loading), so large teachers load with one copy of the weights.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import transformers
from timm.data import (
    IMAGENET_DEFAULT_MEAN,
    IMAGENET_DEFAULT_STD,
    IMAGENET_INCEPTION_MEAN,
    IMAGENET_INCEPTION_STD,
)
from torch import Tensor, nn
from transformers import AutoConfig, PretrainedConfig
from transformers.models.auto.configuration_auto import CONFIG_MAPPING

from radio_lit.teachers.loading import TeacherDtype, cast, download_errors, torch_dtype
from radio_lit.teachers.speed import TeacherSpeed
from radio_lit.teachers.tokens import SummarySource, TokenLayout, TokenTeacher

#: The vision model to run for a config's model type (a full CLIP-like checkpoint holds the
#: image tower under ``vision_model.*``, which the vision class loads alone). Named, and taken
#: from ``transformers`` when built (:func:`transformers_class`).
VISION_MODELS: dict[str, str] = {
    "dinov2": "Dinov2Model",
    "dinov2_with_registers": "Dinov2WithRegistersModel",
    "dinov3_vit": "DINOv3ViTModel",
    "siglip": "SiglipVisionModel",
    "siglip_vision_model": "SiglipVisionModel",
}

#: Pixel statistics by architecture (what each family's image processor uses), for a model
#: without an image processor config of its own (a model type built from ``model_kwargs``,
#: a directory without ``preprocessor_config.json``): SigLIP and SAM3 map [0, 1] to [-1, 1];
#: DINOv2/v3 and SAM2 use ImageNet's. A checkpoint's own config wins (DINOv3's SAT-493M
#: weights use mean (0.430, 0.411, 0.296), std (0.213, 0.156, 0.143), not ImageNet's).
PIXEL_STATS: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "dinov2": (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
    "dinov2_with_registers": (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
    "dinov3_vit": (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
    "siglip": (IMAGENET_INCEPTION_MEAN, IMAGENET_INCEPTION_STD),
    "siglip_vision_model": (IMAGENET_INCEPTION_MEAN, IMAGENET_INCEPTION_STD),
    "sam2_vision_model": (IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
    "sam3_vision_model": (IMAGENET_INCEPTION_MEAN, IMAGENET_INCEPTION_STD),
}

#: Model types refused, with the reason.
REFUSED: dict[str, str] = {
    "siglip2": (
        "Siglip2VisionModel is SigLIP2's NaFlex variant: it takes variable-length patch "
        "sequences with their own position layout (pixel_attention_mask, spatial_shapes), not "
        "a square view with a fixed grid. Use a fixed-resolution SigLIP2 checkpoint "
        "(google/siglip2-*-patch16-384, model type 'siglip') or open_clip's ViT-*-SigLIP2-*"
    ),
}
REFUSED["siglip2_vision_model"] = REFUSED["siglip2"]
REFUSED["clip"] = (
    "A full CLIPModel checkpoint holds the image and the text towers, and its forward needs "
    "text. Use radio_lit.teachers.OpenCLIPTeacher (open_clip's CLIP models, e.g. model_name "
    "ViT-L-14 with pretrained openai), or a CLIPVisionModel checkpoint (model type "
    "'clip_vision_model')"
)

LOCAL_HINT = (
    "On an offline machine set HF_HUB_OFFLINE=1 and give a local directory written by "
    "save_pretrained (or a downloaded snapshot of the repository) as model."
)


class TransformersTeacher(TokenTeacher):
    """Frozen transformers vision encoder returning ``last_hidden_state`` tokens.

    Outputs for a view ``[B, 3, H, W]``: ``features`` ``[B, H/p, W/p, C]`` (the
    ``last_hidden_state`` patch tokens as the model returns them; class and register tokens,
    counted from the output, dropped) and ``summary`` ``[B, C]``: the model's
    ``pooler_output`` (``summary: pooled``, default: the normed CLS token of DINOv2/v3, the
    attention-pool embedding of SigLIP), the class token of ``last_hidden_state`` (``cls``,
    refused for a model without one, such as SigLIP), or none.

    Whether the tokens are normed is the model's choice: DINOv2/v3's and SigLIP's
    ``last_hidden_state`` come after their final layer norm; a ``CLIPVisionModel``'s come
    before its ``post_layernorm``, which it applies to the pooled class token only, so its
    features are un-normed tokens and its ``pooled`` summary is normed. [choice] No norm is
    added: the targets are what the library returns.

    Model types with a dedicated vision class (:data:`VISION_MODELS`: SigLIP, DINOv2,
    DINOv3) run it; others run ``AutoModel``. SigLIP2's NaFlex ``Siglip2VisionModel`` and a
    full ``CLIPModel`` (image and text towers) are refused (:data:`REFUSED`).

    Args:
        model: an HF model id, a local directory written by ``save_pretrained``, or, with
            ``pretrained=False``, a model type (``"dinov3_vit"``, ``"siglip_vision_model"``...)
            built from ``model_kwargs`` (tests).
        pretrained: load the weights (``False``: random, from the config).
        resolution: input side in pixels; default the config's ``image_size``. Models with a
            fixed position embedding (SigLIP) interpolate it for other sizes.
        model_kwargs: config overrides (``hidden_size``, ``num_hidden_layers``...).
        follow_student: view at the student's grid (RADIOv2.5 4.2).
        summary: summary source (see above).
        mean: pixel mean override; default the checkpoint's image processor config
            (``image_mean``), else by architecture (:data:`PIXEL_STATS`).
        std: pixel std override, as ``mean``.
        trust_remote_code: let a hub repository run its own Python code while loading. Off by
            default: a repository's code runs with your permissions.
        dtype: teacher precision (``bfloat16``...); outputs stay float32.
        channels_last: convolution weights and views in channels-last memory format
            (:meth:`~radio_lit.teachers.Teacher.freeze`; docs/teachers.md). [choice]
        speed: compile, FP8 and attention-backend options of the encoder
            (:class:`~radio_lit.teachers.speed.TeacherSpeed`; docs/speed.md).
    """

    def __init__(
        self,
        model: str,
        pretrained: bool = True,
        resolution: int | None = None,
        model_kwargs: dict[str, Any] | None = None,
        follow_student: bool = False,
        summary: SummarySource = "pooled",
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        trust_remote_code: bool = False,
        dtype: TeacherDtype | None = None,
        channels_last: bool = False,
        speed: TeacherSpeed | None = None,
    ) -> None:
        name = type(self).__name__
        net, config = build_transformers(
            name, model, pretrained, dict(model_kwargs or {}), trust_remote_code, None, dtype
        )
        layout = transformers_layout(name, model, config, resolution, summary, mean, std)
        super().__init__(layout, follow_student)
        self.model = net
        self._native = square_side(config.image_size)
        self.freeze(channels_last, speed)

    def tokens(self, view: Tensor) -> tuple[Tensor, Tensor | None]:
        return transformers_tokens(self.model, view, self._native)


def transformers_tokens(net: nn.Module, view: Tensor, native: int) -> tuple[Tensor, Tensor | None]:
    """``last_hidden_state`` ``[B, prefix + N, C]`` and ``pooler_output`` (or ``None``) of a
    transformers vision model; a fixed position embedding (SigLIP) is interpolated for views
    other than the ``native`` side."""
    kwargs = {}
    if tuple(view.shape[-2:]) != (native, native) and (
        "interpolate_pos_encoding" in inspect.signature(net.forward).parameters
    ):
        kwargs["interpolate_pos_encoding"] = True
    out = net(pixel_values=view, **kwargs)
    return out.last_hidden_state, getattr(out, "pooler_output", None)


def transformers_layout(
    teacher: str,
    model: str,
    config: PretrainedConfig,
    resolution: int | None,
    summary: SummarySource,
    mean: tuple[float, float, float] | None,
    std: tuple[float, float, float] | None,
) -> TokenLayout:
    """The :class:`TokenLayout` of a transformers vision model from its config; a ``cls``
    summary of a model without a class token is refused."""
    stats = pixel_stats(teacher, model, config, mean, std)
    if summary == "cls" and prefix_tokens(config) == 0:
        raise ValueError(
            f"{teacher}: {model!r} ({config.model_type}) has no class token; use summary: "
            "pooled (its pooler_output) or summary: none."
        )
    return TokenLayout(
        resolution=resolution or square_side(config.image_size),
        patch_size=square_side(config.patch_size),
        mean=tuple(stats[0]),
        std=tuple(stats[1]),
        feature_dim=config.hidden_size,
        summary_dim=config.hidden_size,
        summary=summary,
        num_prefix_tokens=prefix_tokens(config),
    )


def prefix_tokens(config: PretrainedConfig) -> int | None:
    """Class + register tokens of the families whose layout is known, else ``None`` (then
    counted from each output)."""
    if config.model_type.startswith(("dinov2", "dinov3")):
        return 1 + int(getattr(config, "num_register_tokens", 0) or 0)
    if config.model_type.startswith("siglip"):
        return 0
    return None


def square_side(size: int | tuple[int, int] | list[int]) -> int:
    """One side of a square size given as an int or a pair."""
    if isinstance(size, int):
        return size
    if size[0] != size[1]:
        raise ValueError(f"a square input size is needed, the config has {tuple(size)}")
    return int(size[0])


def is_model_type(model: str) -> bool:
    """Whether ``model`` names a transformers model type rather than an id or a directory."""
    return model in CONFIG_MAPPING and not os.path.isdir(model)


def load_config(
    teacher: str, model: str, pretrained: bool, overrides: dict[str, Any], trust_remote_code: bool
) -> PretrainedConfig:
    """The config of ``model`` (an id, a directory, or a model type built from ``overrides``)."""
    if is_model_type(model):
        if pretrained:
            raise ValueError(
                f"{teacher}: {model!r} is a transformers model type, which has no weights; give "
                "an HF id or a local directory, or set pretrained: false for random weights."
            )
        return AutoConfig.for_model(model, **overrides)
    with download_errors(teacher, model, LOCAL_HINT):
        config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code)
    if hasattr(config, "vision_config") and config.model_type in VISION_MODELS:
        config = config.vision_config  # a CLIP-like checkpoint: its image tower's config
    config.update(overrides)
    return config


def transformers_class(name: str) -> Any:
    """``transformers.<name>``, imported when a teacher is built: transformers' model classes
    import its whole modeling stack (~1 CPU-s), which a run without a transformers teacher
    (the quickstart, every fresh ``radio-lit`` process) does not need."""
    return getattr(transformers, name)


def build_transformers(
    teacher: str,
    model: str,
    pretrained: bool,
    overrides: dict[str, Any],
    trust_remote_code: bool,
    model_types: tuple[str, ...] | None,
    dtype: TeacherDtype | None,
) -> tuple[nn.Module, PretrainedConfig]:
    """The vision model for ``model`` and its config, refused with a reason when its type is
    not one ``teacher`` runs."""
    config = load_config(teacher, model, pretrained, overrides, trust_remote_code)
    kind = config.model_type
    if kind in REFUSED:
        raise ValueError(f"{teacher}: {model!r} is a {kind!r} model. {REFUSED[kind]}.")
    if model_types is not None and kind not in model_types:
        raise ValueError(
            f"{model!r} is a {kind!r} model; {teacher} runs {' / '.join(model_types)} models."
        )
    model_class = transformers_class(VISION_MODELS.get(kind, "AutoModel"))
    if not pretrained:
        auto = model_class is transformers.AutoModel
        net = model_class.from_config(config) if auto else model_class(config)
        return cast(net, dtype), config
    with download_errors(teacher, model, LOCAL_HINT):
        net = model_class.from_pretrained(
            model, config=config, dtype=torch_dtype(dtype), trust_remote_code=trust_remote_code
        )
    return net, config


def pixel_stats(
    teacher: str,
    model: str,
    config: PretrainedConfig,
    mean: tuple[float, ...] | None,
    std: tuple[float, ...] | None,
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Pixel ``(mean, std)``: the overrides, else the checkpoint's image processor config
    (``image_mean`` / ``image_std`` of its ``preprocessor_config.json``), else the
    architecture's (:data:`PIXEL_STATS`)."""
    if mean is not None and std is not None:
        return mean, std
    known = None if is_model_type(model) else processor_stats(model)
    if known is None:
        known = PIXEL_STATS.get(config.model_type)
    if known is None:
        raise ValueError(
            f"{teacher}: no pixel statistics known for a {config.model_type!r} model; give "
            "mean and std (the image processor's image_mean / image_std)."
        )
    return (mean or tuple(known[0])), (std or tuple(known[1]))


def processor_stats(model: str) -> tuple[tuple[float, ...], tuple[float, ...]] | None:
    """``(image_mean, image_std)`` of ``model``'s image processor config (an HF id or a
    directory), or ``None`` where it has none or the config states no statistics."""
    # imported when called, as the model classes are (transformers_class)
    from transformers.image_processing_utils import ImageProcessingMixin

    try:
        processor, _ = ImageProcessingMixin.get_image_processor_dict(model)
    except (OSError, ValueError):
        return None
    mean, std = processor.get("image_mean"), processor.get("image_std")
    if mean is None or std is None:
        return None
    return tuple(map(float, mean)), tuple(map(float, std))
