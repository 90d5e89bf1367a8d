"""CLIP-family teachers from open_clip: DFN CLIP, SigLIP, SigLIP2, OpenAI CLIP (AM-RADIO 3.4
and 4; C-RADIOv3/v4 distill SigLIP2).

The summary is the image embedding that zero-shot classification uses, the dense features are
the patch tokens of the last block after the tower's final norm (prefix tokens dropped).
Pixel statistics follow the architecture, whatever the weights' source (:func:`pixel_stats`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from copy import deepcopy
from typing import Any

import open_clip
import open_clip.factory
import torch
from open_clip.timm_model import TimmModel
from open_clip.transformer import VisionTransformer
from torch import Tensor, nn

from radio_lit.teachers._errors import unknown_name
from radio_lit.teachers.base import Teacher, TeacherOutput
from radio_lit.teachers.loading import (
    TeacherDtype,
    assigning_loads,
    cast,
    download_errors,
    materialize,
)
from radio_lit.teachers.speed import TeacherSpeed


class OpenCLIPTeacher(Teacher):
    """Frozen open_clip image tower; any open_clip model with a ViT image tower.

    AM-RADIO section 4 uses DFN CLIP ``ViT-H-14-378-quickgelu`` (``dfn5b``) and OpenAI CLIP
    ``ViT-L-14-336`` (``openai``); PHI-S adds SigLIP ``ViT-SO400M-14-SigLIP-384`` (``webli``);
    C-RADIOv4 distills SigLIP2 ``ViT-gopt-16-SigLIP2-384`` (``webli``; also
    ``ViT-B-16-SigLIP2``, ``ViT-SO400M-16-SigLIP2-384``...: ``open_clip.list_models()``).
    SigLIP/SigLIP2 have no class token: the summary is the attention-pool (MAP) embedding
    ``encode_image`` returns, the features the trunk's normed patch tokens before the pool.

    Outputs for a view ``[B, 3, R, R]``:

    - ``summary``: ``[B, embed_dim]``, the zero-shot image embedding, i.e. what
      ``model.encode_image(x, normalize=False)`` returns (the projected class token of an
      OpenAI-style tower, AM-RADIO 3.4; the MAP-pooled token of SigLIP); unnormalized, which
      the cosine summary loss does not mind;
    - ``features``: ``[B, R/p, R/p, width]``, the last block's patch tokens after the final
      norm (``ln_post`` of an OpenAI-style tower, the trunk's ``norm`` of a timm tower such
      as SigLIP's), with class/register tokens dropped.

    Args:
        model_name: open_clip architecture name (see ``open_clip.list_models()``), or an
            ``hf-hub:org/repo`` / ``local-dir:/path`` id carrying its own config and weights.
        pretrained: an open_clip pretrained tag of ``model_name`` (downloaded by open_clip,
            see ``open_clip.list_pretrained_tags_by_model(model_name)``), a local checkpoint
            file, or ``None`` for random weights (tests).
        model_cfg: open_clip model config (``embed_dim``, ``vision_cfg``, ``text_cfg``) used
            as the architecture of ``model_name`` instead of a built-in config; lets a YAML
            describe a custom (e.g. tiny) model, built by the same ``open_clip.create_model``.
        resolution: input side in pixels, a multiple of the patch size; default the tower's
            image size rounded down to whole patches (SigLIP-384 with 14 px patches: 378, the
            27x27 patches its convolution sees). Another value rebuilds the tower at that size
            (open_clip interpolates the position embedding).
        mean: pixel mean (0-1 scale); default the architecture's (:func:`pixel_stats`):
            SigLIP/SigLIP2 ``0.5``, OpenAI CLIP's for OpenAI-style towers, also when the
            weights come from a local file.
        std: pixel std, as ``mean``.
        keep_text: keep the whole CLIP model (text tower included) in :attr:`clip`; by default
            only the image tower is kept (and, with a local ``pretrained`` file, the model is
            built on the meta device and the file's tensors assigned: one copy in memory).
        dtype: teacher precision (``bfloat16`` halves its memory; outputs stay float32).
        channels_last: convolution weights and views in channels-last memory format
            (:meth:`~radio_lit.teachers.Teacher.freeze`; docs/teachers.md). [choice]
        speed: compile, FP8 and attention-backend options of the encoder
            (:class:`~radio_lit.teachers.speed.TeacherSpeed`; docs/speed.md).
    """

    def __init__(
        self,
        model_name: str,
        pretrained: str | None = None,
        model_cfg: dict[str, Any] | None = None,
        resolution: int | None = None,
        mean: tuple[float, float, float] | None = None,
        std: tuple[float, float, float] | None = None,
        keep_text: bool = False,
        dtype: TeacherDtype | None = None,
        channels_last: bool = False,
        speed: TeacherSpeed | None = None,
    ) -> None:
        model, embed_dim = _create_clip(model_name, pretrained, model_cfg, resolution, keep_text)
        visual = model.visual
        side, patch_size, width = _tower_geometry(visual)
        if resolution is None:
            side = _whole_patches(visual, side, patch_size)
        stats = pixel_stats(model_name, pretrained, model_cfg, model)
        super().__init__(
            resolution=side,
            patch_size=patch_size,
            mean=mean if mean is not None else stats[0],
            std=std if std is not None else stats[1],
        )
        model = cast(model, dtype)
        self.model = model.visual
        self.clip = model if keep_text else None
        self._feature_dim = width
        self._summary_dim = embed_dim
        self.freeze(channels_last, speed)

    @property
    def feature_dim(self) -> int:
        return self._feature_dim

    @property
    def summary_dim(self) -> int:
        return self._summary_dim

    def encode(self, view: Tensor) -> TeacherOutput:
        """``[B, 3, R, R]`` -> summary ``[B, embed_dim]``, features ``[B, R/p, R/p, width]``."""
        out = self.model.forward_intermediates(
            view, indices=1, normalize_intermediates=True, output_fmt="NCHW"
        )
        features = out["image_intermediates"][-1].permute(0, 2, 3, 1)
        return TeacherOutput(summary=out["image_features"], features=features)


def _create_clip(
    model_name: str,
    pretrained: str | None,
    model_cfg: dict[str, Any] | None,
    resolution: int | None,
    keep_text: bool = False,
) -> tuple[nn.Module, int]:
    """Build the open_clip model and return it with its embedding dim (the summary dim).

    A local weights file (not big_vision ``.npz``) for the image tower alone is loaded by
    open_clip's ``load_checkpoint`` (its key conversions) into a meta-built model whose
    parameters it assigns; the text tower, never materialized, is dropped by the caller.
    """
    schema = model_name.startswith(("hf-hub:", "local-dir:"))  # config and weights elsewhere
    # open_clip spells built-in names with "-" ("ViT-B/32" is "ViT-B-32")
    name = model_name if schema else model_name.replace("/", "-")
    if model_cfg is not None and schema:
        raise ValueError(
            f"model_cfg describes a new architecture; it cannot be combined with {model_name!r}, "
            "which carries its own config. Give a plain name with model_cfg."
        )
    if model_cfg is None and not schema and name not in open_clip.list_models():
        raise unknown_name(
            "open_clip model",
            model_name,
            open_clip.list_models(),
            "List them with open_clip.list_models().",
        )
    if (
        pretrained is not None
        and not os.path.isfile(pretrained)
        and not open_clip.is_pretrained_cfg(name, pretrained)
    ):
        raise ValueError(
            f"pretrained={pretrained!r} is neither a local file nor a pretrained tag of open_clip "
            f"model {model_name!r} (tags: {open_clip.list_pretrained_tags_by_model(name)})."
        )
    config = model_cfg if model_cfg is not None else open_clip.get_model_config(name)
    from_file = pretrained is not None and os.path.isfile(pretrained)
    if from_file and not keep_text and not pretrained.endswith((".npz", ".npy")):
        with _registered_config(name, model_cfg), torch.device("meta"), _no_random_init_line():
            model = open_clip.create_model(model_name, force_image_size=resolution, device="meta")
        with assigning_loads(model):
            open_clip.load_checkpoint(model, pretrained, weights_only=True)
        materialize(model.visual)
        return model, config["embed_dim"]
    hint = (
        "On an offline machine give a local checkpoint file as pretrained (set HF_HUB_OFFLINE=1 "
        "so that a missing download fails at once)."
    )
    with _registered_config(name, model_cfg), download_errors("OpenCLIPTeacher", model_name, hint):
        model = open_clip.create_model(  # weights as tensors only, never pickled code
            model_name, pretrained=pretrained, force_image_size=resolution, weights_only=True
        )
    return model, config["embed_dim"]


def pixel_stats(
    model_name: str, pretrained: str | None, model_cfg: dict[str, Any] | None, model: nn.Module
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Pixel ``(mean, std)`` of the architecture, whatever the weights' source.

    open_clip sets a model's preprocess config from its pretrained tag, or from the config of
    an ``hf-hub:`` / ``local-dir:`` model; for a local weights file or random weights it falls
    back to OpenAI CLIP's statistics, wrong for SigLIP/SigLIP2 (0.5, 0.5). Here the fallback
    is the architecture's: the statistics all pretrained tags of ``model_name`` share (e.g.
    ``webli`` for ``ViT-gopt-16-SigLIP2-384``), else those of a timm trunk's
    ``pretrained_cfg`` (timm's SigLIP ViTs: 0.5), else open_clip's (OpenAI's).
    """
    preprocess = open_clip.get_model_preprocess_cfg(model)
    own = (tuple(preprocess["mean"]), tuple(preprocess["std"]))
    name = model_name.replace("/", "-")
    if model_name.startswith(("hf-hub:", "local-dir:")) or (
        pretrained is not None and not os.path.isfile(pretrained)
    ):
        return own  # the tag's or the hub config's own statistics
    if model_cfg is None:
        tagged = {
            (tuple(cfg.get("mean", own[0])), tuple(cfg.get("std", own[1])))
            for cfg in (
                open_clip.get_pretrained_cfg(name, tag)
                for tag in open_clip.list_pretrained_tags_by_model(name)
            )
        }
        if len(tagged) == 1:
            return tagged.pop()
    if isinstance(model.visual, TimmModel):
        cfg = model.visual.trunk.pretrained_cfg
        return tuple(cfg["mean"]), tuple(cfg["std"])
    return own


#: What open_clip logs after ``create_model`` without ``pretrained``.
_RANDOM_INIT_LINE = "No pretrained weights loaded for model"


@contextmanager
def _no_random_init_line() -> Iterator[None]:
    """Drop open_clip's "No pretrained weights loaded … initialized randomly" warning (its root
    logger's) while the block runs: the model built there gets the local file's weights next,
    so the line would be wrong."""

    def keep(record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith(_RANDOM_INIT_LINE)

    root = logging.getLogger()
    root.addFilter(keep)
    try:
        yield
    finally:
        root.removeFilter(keep)


@contextmanager
def _registered_config(name: str, model_cfg: dict[str, Any] | None) -> Iterator[None]:
    """Make ``model_cfg`` open_clip's config for ``name`` while the block runs (no-op if None).

    open_clip resolves architectures by name from its config registry; registering only for
    the duration of ``create_model`` keeps two teachers with the same name independent.
    """
    if model_cfg is None:
        yield
        return
    configs = open_clip.factory._MODEL_CONFIGS
    previous = configs.get(name)
    configs[name] = deepcopy(model_cfg)
    try:
        yield
    finally:
        if previous is None:
            del configs[name]
        else:
            configs[name] = previous


def _tower_geometry(visual: nn.Module) -> tuple[int, int, int]:
    """``(input side, patch size, width)`` of a square ViT image tower (OpenAI-style or timm).

    A timm trunk is built at its own image size (open_clip does not pass ``image_size`` on),
    so its patch embedding tells the size it accepts.
    """
    if isinstance(visual, VisionTransformer):
        size, patch, width = visual.image_size, visual.patch_size, visual.transformer.width
    elif isinstance(visual, TimmModel) and hasattr(visual.trunk, "patch_embed"):
        embed = visual.trunk.patch_embed
        size, patch, width = embed.img_size, embed.patch_size, visual.trunk.num_features
    else:
        raise TypeError(
            f"OpenCLIPTeacher needs a ViT image tower, got {type(visual).__name__}; "
            "convolutional towers have no patch tokens to distill."
        )
    if size[0] != size[1]:
        raise ValueError(f"OpenCLIPTeacher needs a square image size, got {tuple(size)}.")
    return size[0], patch[0], width


def _whole_patches(visual: nn.Module, side: int, patch_size: int) -> int:
    """The tower's input side rounded down to whole patches, keeping the same patch grid.

    A 384 px tower with 14 px patches (SigLIP) has a 27x27 grid: its patch convolution never
    sees the last 6 px rows and columns. Views of 378 px let the grid cover the whole crop. A
    timm trunk checks the input size, so it is told the new size; the grid and the position
    embedding stay the same.
    """
    whole = side // patch_size * patch_size
    if whole != side and isinstance(visual, TimmModel):
        visual.set_input_size(whole)
    return whole
