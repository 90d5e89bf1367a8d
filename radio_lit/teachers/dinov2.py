"""DINOv2 teachers from timm or transformers (AM-RADIO 3.4 and 4; RADIOv2.5 uses the reg4 models).

The summary is the CLS token after the final norm; the dense features are the patch tokens
after the final norm, with the CLS and register tokens dropped.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import timm
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import VisionTransformer
from torch import Tensor, nn
from transformers import (
    AutoConfig,
    Dinov2Config,
    Dinov2Model,
    Dinov2WithRegistersConfig,
    Dinov2WithRegistersModel,
)

from radio_lit.teachers._errors import require_file, unknown_name
from radio_lit.teachers.base import Teacher, TeacherOutput

#: transformers model types this teacher runs, with their config and model classes.
_HF_MODELS: dict[str, tuple[type, type[nn.Module]]] = {
    "dinov2": (Dinov2Config, Dinov2Model),
    "dinov2_with_registers": (Dinov2WithRegistersConfig, Dinov2WithRegistersModel),
}


class _Spec(NamedTuple):
    """What the teacher needs to know about a built DINOv2 encoder."""

    resolution: int
    patch_size: int
    num_prefix_tokens: int  # CLS + registers, in front of the patch tokens
    dim: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


class DINOv2Teacher(Teacher):
    """Frozen DINOv2 ViT (with or without registers) from timm or transformers.

    AM-RADIO section 4 runs DINOv2 ViT-g/14 at 224 px (its features are upsampled to the
    student's grid); RADIOv2.5 uses the 4-register variant, e.g. timm
    ``vit_giant_patch14_reg4_dinov2.lvd142m`` or transformers
    ``facebook/dinov2-with-registers-giant``.

    Outputs for a view ``[B, 3, R, R]``: ``summary`` ``[B, C]`` (normed CLS token) and
    ``features`` ``[B, R/14, R/14, C]`` (normed patch tokens, registers dropped).

    Weights come from ``checkpoint`` if given, else from the library's hub if ``pretrained``,
    else they are random (tests).

    Args:
        model: timm backend: a timm model name (``timm.list_models('*dinov2*')``), optionally
            with a pretrained tag. transformers backend: an HF model id or a local directory
            written by ``save_pretrained``; with ``pretrained=False`` also a model type,
            ``"dinov2"`` or ``"dinov2_with_registers"``, built from ``model_kwargs``.
        backend: library that builds and runs the model.
        pretrained: load the library's pretrained weights (timm hub / HF hub or directory).
        checkpoint: local timm checkpoint file (timm backend; timm's own state dict or Meta's
            original DINOv2 checkpoint, which timm converts).
        resolution: input side in pixels; default the model's image size. timm builds the
            model at this size (the position embedding of pretrained weights is resampled
            once); transformers interpolates its position embedding at every call.
        model_kwargs: timm backend: keyword arguments of ``timm.create_model`` (``depth``,
            ``embed_dim``, ``num_heads``, ``img_size``...). transformers backend: config
            overrides (``hidden_size``, ``num_hidden_layers``, ``num_register_tokens``...).
        follow_student: run at the student's grid (view side ``student grid x 14``) instead of
            ``resolution`` (RADIOv2.5 4.2: DINOv2 infers at any resolution); the timm model is
            then built with ``dynamic_img_size=True`` (position embedding interpolated).
        trust_remote_code: transformers backend: let a Hugging Face repository run its own
            Python code while loading. Off by default: DINOv2 needs none, and a hub repository's
            code runs with your permissions. Checkpoints and weight files are always loaded as
            tensors only (safetensors or ``torch.load(weights_only=True)``).
    """

    def __init__(
        self,
        model: str,
        backend: Literal["timm", "transformers"] = "timm",
        pretrained: bool = True,
        checkpoint: str | None = None,
        resolution: int | None = None,
        model_kwargs: dict[str, Any] | None = None,
        follow_student: bool = False,
        trust_remote_code: bool = False,
    ) -> None:
        kwargs = dict(model_kwargs or {})
        if backend == "timm":
            if follow_student:
                kwargs["dynamic_img_size"] = True
            net, spec = _build_timm(model, pretrained, checkpoint, resolution, kwargs)
        elif backend == "transformers":
            if checkpoint is not None:
                raise ValueError(
                    "checkpoint is a timm file; with the transformers backend give the "
                    "directory written by save_pretrained as model."
                )
            net, spec = _build_transformers(
                model, pretrained, resolution, kwargs, trust_remote_code
            )
        else:
            raise ValueError(f"unknown backend {backend!r}; use 'timm' or 'transformers'.")
        super().__init__(spec.resolution, spec.patch_size, spec.mean, spec.std, follow_student)
        self.backend = backend
        self.model = net
        self.num_prefix_tokens = spec.num_prefix_tokens
        self._dim = spec.dim
        self.freeze()

    @property
    def feature_dim(self) -> int:
        return self._dim

    @property
    def summary_dim(self) -> int:
        return self._dim

    def encode(self, view: Tensor) -> TeacherOutput:
        """``[B, 3, R, R]`` -> summary ``[B, C]``, features ``[B, R/p, R/p, C]``."""
        if self.backend == "timm":
            tokens = self.model.forward_features(view)  # [B, 1 + registers + N, C], normed
        else:
            tokens = self.model(pixel_values=view).last_hidden_state
        batch, _, height, width = view.shape
        features = tokens[:, self.num_prefix_tokens :].reshape(
            batch, height // self.patch_size, width // self.patch_size, -1
        )
        return TeacherOutput(summary=tokens[:, 0], features=features)


def _build_timm(
    model: str,
    pretrained: bool,
    checkpoint: str | None,
    resolution: int | None,
    kwargs: dict[str, Any],
) -> tuple[nn.Module, _Spec]:
    """A timm DINOv2 ViT and its spec; ``kwargs`` go to ``timm.create_model``."""
    if not timm.is_model(model):
        raise unknown_name(
            "timm model",
            model,
            timm.list_models(),
            "List DINOv2 models with timm.list_models('*dinov2*').",
        )
    # resolution becomes timm's img_size; an img_size in model_kwargs must not contradict it
    if resolution is not None and kwargs.setdefault("img_size", resolution) != resolution:
        raise ValueError(
            f"resolution={resolution} and model_kwargs img_size={kwargs['img_size']} "
            "disagree; give only one."
        )
    if checkpoint is not None:
        file = require_file(
            checkpoint, "DINOv2 checkpoint", "Give a timm or Meta DINOv2 state dict file."
        )
        kwargs["pretrained_cfg_overlay"] = {"file": str(file)}
    net = timm.create_model(model, pretrained=pretrained or checkpoint is not None, **kwargs)
    if not (isinstance(net, VisionTransformer) and net.has_class_token):
        raise TypeError(f"DINOv2Teacher needs a timm ViT with a class token, got {model!r}.")
    spec = _Spec(
        resolution=net.patch_embed.img_size[0],
        patch_size=net.patch_embed.patch_size[0],
        num_prefix_tokens=net.num_prefix_tokens,
        dim=net.num_features,
        mean=net.pretrained_cfg["mean"],
        std=net.pretrained_cfg["std"],
    )
    return net, spec


def _build_transformers(
    model: str,
    pretrained: bool,
    resolution: int | None,
    kwargs: dict[str, Any],
    trust_remote_code: bool = False,
) -> tuple[nn.Module, _Spec]:
    """A transformers DINOv2 model and its spec; ``kwargs`` override the config."""
    if model in _HF_MODELS:
        if pretrained:
            raise ValueError(
                f"{model!r} is a transformers model type, which has no weights; give an HF id "
                "or a local directory, or set pretrained: false for random weights."
            )
        config = _HF_MODELS[model][0](**kwargs)
    else:
        config = AutoConfig.from_pretrained(model, trust_remote_code=trust_remote_code, **kwargs)
    if config.model_type not in _HF_MODELS:
        raise ValueError(
            f"{model!r} is a {config.model_type!r} model; DINOv2Teacher runs "
            f"{' / '.join(_HF_MODELS)} models."
        )
    model_class = _HF_MODELS[config.model_type][1]
    net = (
        model_class.from_pretrained(model, config=config, trust_remote_code=trust_remote_code)
        if pretrained
        else model_class(config)
    )
    spec = _Spec(
        resolution=resolution or config.image_size,
        patch_size=config.patch_size,
        num_prefix_tokens=1 + getattr(config, "num_register_tokens", 0),
        dim=config.hidden_size,
        mean=IMAGENET_DEFAULT_MEAN,
        std=IMAGENET_DEFAULT_STD,
    )
    return net, spec
