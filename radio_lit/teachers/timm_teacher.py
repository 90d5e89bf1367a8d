"""Generic timm ViT teacher: the token layout, patch size and pixel statistics come from the
model (``num_prefix_tokens``, ``patch_embed``, ``pretrained_cfg``), so a new timm family
(DINOv2, DINOv3, SigLIP, EVA...) needs a YAML block, not a class.
"""

from __future__ import annotations

import sys
from typing import Any

import timm
from torch import Tensor, nn

from radio_lit.teachers._errors import require_file, unknown_name
from radio_lit.teachers.loading import (
    TeacherDtype,
    assign_weights,
    build_on_meta,
    cast,
    download_errors,
    read_state_dict,
)
from radio_lit.teachers.speed import TeacherSpeed
from radio_lit.teachers.tokens import SummarySource, TokenLayout, TokenTeacher, default_summary


class TimmTeacher(TokenTeacher):
    """Frozen timm ViT-like encoder (``VisionTransformer``, ``Eva``...): any model with
    ``forward_features`` returning ``[B, prefix + N, C]`` tokens.

    Outputs for a view ``[B, 3, H, W]``: ``features`` ``[B, H/p, W/p, C]`` (the patch tokens
    of ``forward_features``, the ``model.num_prefix_tokens`` class/register tokens dropped)
    and ``summary`` ``[B, C]``: the class token of ``forward_features`` (``summary: cls``,
    default for models with one), or the model's pooled pre-logits
    ``forward_head(x, pre_logits=True)`` (``summary: pooled``: the attention pool of timm's
    SigLIP ViTs, default without a class token).

    The tokens are after the model's final norm, except for a model built with
    ``use_fc_norm`` (timm's default with ``global_pool="avg"``, e.g. BEiT / MAE fine-tunes):
    its ``norm`` is an identity and ``fc_norm`` norms the pooled vector only, so its features
    and ``cls`` summary are un-normed and its ``pooled`` summary normed. [choice] No norm is
    added: the targets are what the model returns.

    Weights: ``checkpoint`` (a local file; built on the meta device and assigned, see
    :mod:`radio_lit.teachers.loading`; timm's ``checkpoint_filter_fn`` converts the original
    releases' keys), else timm's hub if ``pretrained``, else random (tests).

    Args:
        model: timm model name, optionally with a pretrained tag (``timm.list_models()``).
        pretrained: download timm's pretrained weights (ignored with ``checkpoint``).
        checkpoint: local weights file (safetensors or a ``torch.save`` state dict).
        resolution: input side in pixels; default the model's ``img_size``. Passed to timm as
            ``img_size`` (a learned position embedding is resampled once).
        model_kwargs: keyword arguments of ``timm.create_model`` (``depth``, ``embed_dim``...).
        follow_student: view at the student's grid (RADIOv2.5 4.2); the model is then built
            with ``dynamic_img_size=True``.
        summary: summary source, see above; ``"none"`` for a features-only teacher.
        mean: pixel mean override (default: ``pretrained_cfg["mean"]`` of the model).
        std: pixel std override (default: ``pretrained_cfg["std"]``).
        dtype: teacher precision (``bfloat16`` halves its memory; outputs stay float32).
        channels_last: convolution weights and views in channels-last memory format
            (:meth:`~radio_lit.teachers.Teacher.freeze`; docs/teachers.md). [choice]
        speed: compile, FP8 and attention-backend options of the encoder
            (:class:`~radio_lit.teachers.speed.TeacherSpeed`; docs/speed.md).
    """

    def __init__(
        self,
        model: str,
        pretrained: bool = True,
        checkpoint: str | None = None,
        resolution: int | None = None,
        model_kwargs: dict[str, Any] | None = None,
        follow_student: bool = False,
        summary: SummarySource | None = None,
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        dtype: TeacherDtype | None = None,
        channels_last: bool = False,
        speed: TeacherSpeed | None = None,
    ) -> None:
        kwargs = dict(model_kwargs or {})
        if follow_student:
            kwargs["dynamic_img_size"] = True
        name = type(self).__name__
        net = build_timm(name, model, pretrained, checkpoint, resolution, kwargs)
        super().__init__(timm_layout(name, net, model, summary, mean, std), follow_student)
        self.model = cast(net, dtype)
        self.freeze(channels_last, speed)

    def tokens(self, view: Tensor) -> tuple[Tensor, Tensor | None]:
        return timm_tokens(self.model, view, self.summary_source)


def timm_tokens(
    net: nn.Module, view: Tensor, summary: SummarySource
) -> tuple[Tensor, Tensor | None]:
    """Normed tokens ``[B, prefix + N, C]`` of a timm model, and its pooled pre-logits
    ``[B, C]`` when ``summary`` is ``"pooled"``."""
    tokens = net.forward_features(view)
    pooled = net.forward_head(tokens, pre_logits=True) if summary == "pooled" else None
    return tokens, pooled


def timm_layout(
    teacher: str,
    net: nn.Module,
    model: str,
    summary: SummarySource | None,
    mean: tuple[float, float, float] | None,
    std: tuple[float, float, float] | None,
) -> TokenLayout:
    """The :class:`TokenLayout` a timm model states: ``patch_embed`` sizes,
    ``num_prefix_tokens``, ``num_features`` and ``pretrained_cfg`` mean/std."""
    if not hasattr(net, "forward_features") or not hasattr(net, "patch_embed"):
        raise TypeError(f"{teacher} needs a timm ViT with patch tokens, got {model!r}.")
    cls_token = getattr(net, "cls_token", None) is not None
    summary = summary or default_summary(cls_token)
    if summary == "cls" and not cls_token:
        raise ValueError(
            f"{teacher}: {model!r} has no class token; use summary: pooled "
            "(its pooled pre-logits) or summary: none."
        )
    embed = net.patch_embed
    return TokenLayout(
        resolution=embed.img_size[0],
        patch_size=embed.patch_size[0],
        mean=tuple(mean if mean is not None else net.pretrained_cfg["mean"]),
        std=tuple(std if std is not None else net.pretrained_cfg["std"]),
        feature_dim=net.num_features,
        summary_dim=net.num_features,
        summary=summary,
        num_prefix_tokens=net.num_prefix_tokens,
    )


def build_timm(
    teacher: str,
    model: str,
    pretrained: bool,
    checkpoint: str | None,
    resolution: int | None,
    kwargs: dict[str, Any],
    pattern: str = "*vit*",
) -> nn.Module:
    """The timm model ``model`` with its weights: from ``checkpoint`` (meta-built, assigned),
    timm's hub (``pretrained``) or random; ``kwargs`` go to ``timm.create_model``; ``pattern``
    is the ``timm.list_models`` pattern an unknown name's error suggests."""
    if not timm.is_model(model):
        raise unknown_name(
            "timm model",
            model,
            timm.list_models(),
            f"List them with timm.list_models({pattern!r}).",
        )
    # resolution becomes timm's img_size; an img_size in model_kwargs must not contradict it
    if resolution is not None and kwargs.setdefault("img_size", resolution) != resolution:
        raise ValueError(
            f"resolution={resolution} and model_kwargs img_size={kwargs['img_size']} "
            "disagree; give only one."
        )
    if checkpoint is not None:
        file = require_file(
            checkpoint, f"{teacher} checkpoint", "Give a timm (or original release) state dict."
        )
        net = build_on_meta(lambda: timm.create_model(model, pretrained=False, **kwargs))
        state = read_state_dict(file)
        convert = getattr(sys.modules[type(net).__module__], "checkpoint_filter_fn", None)
        if convert is not None:  # original-release keys -> timm's (e.g. Meta's DINOv2 files)
            state = convert(state, net)
        assign_weights(net, state)
        return net
    if pretrained:
        with download_errors(
            teacher,
            model,
            "Download the weights where there is a network and give the file as checkpoint.",
        ):
            return timm.create_model(model, pretrained=True, **kwargs)
    return timm.create_model(model, pretrained=False, **kwargs)
