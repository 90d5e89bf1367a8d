"""A CPE ViT student of a published RADIO model's architecture, read from the source itself.

With ``model.init_from`` naming a published model, the student must have its architecture
(:func:`radio_lit.export.init_from.check_architecture`). :class:`PublishedStudent` reads it
from the same file or folder, so that a config need not restate it::

    model:
      student:
        class_path: radio_lit.export.PublishedStudent
        init_args: {source: C-RADIOv4-H.pth.tar}
      init_from: C-RADIOv4-H.pth.tar

What is read (:mod:`radio_lit.export.published`): the timm model and its ``model_kwargs``
(NVlabs' ``args``, a timm folder's ``architecture`` and ``model_args``; for transformers'
``RadioModel`` its widths on ``vit_base_patch16_224``), the CPE grid (``max_resolution``),
the summary tokens (one per teacher, named by them, where the source has one per teacher) and
registers, whether there is a final norm, the feature normalizers (``_feature_normalizer.*``,
``_intermediate_feature_normalizer.*``: :mod:`radio_lit.students.feature_normalizer`). The
weights are not loaded here: ``init_from`` loads them. ``[choice]``: NVlabs' grid is resized
as its inference code does (``cpe_align_corners: false``), which RADIO's layout needs and the
import reproduces; a timm ``naflexvit_*_radio_*`` folder's as timm's class resizes it
(C-RADIOv3-B and -H with ``align_corners=True``, as released).
"""

from __future__ import annotations

from typing import Any, Literal

from radio_lit.export.layout import EMBEDDER, POS_EMBED, PREFIX_TOKENS
from radio_lit.export.published import Published, read_published
from radio_lit.students import CPEViT


def published_architecture(published: Published) -> dict[str, Any]:
    """The :class:`~radio_lit.students.CPEViT` arguments of ``published``'s architecture."""
    state, named = published.state, published.architecture
    weight = state[EMBEDDER]
    patch = int(round((weight.shape[1] / 3) ** 0.5))
    grid = int(round(state[POS_EMBED].shape[1] ** 0.5))
    num_cls = published.num_cls_tokens or 1
    kwargs = dict(named.get("model_kwargs") or {})
    model = named.get("model")
    if not model:  # transformers' RadioModel: its widths on a plain timm ViT
        config = (published.args.get("transformers") or {}) if published.args else {}
        model = "vit_base_patch16_224"
        kwargs = {
            "patch_size": patch,
            "embed_dim": int(weight.shape[0]),
            "depth": int(config.get("num_hidden_layers", 12)),
            "num_heads": int(config.get("num_attention_heads", 12)),
            "mlp_ratio": float(config.get("mlp_ratio", 4.0)),
            "qkv_bias": bool(config.get("qkv_bias", True)),
        }
    if not any(k.startswith("base_model.norm.") for k in state):
        kwargs["final_norm"] = False
    names = list(dict.fromkeys(t["name"] for t in published.teachers))  # NVlabs: unique names
    inter = state.get("_intermediate_feature_normalizer.means")
    rotation = state.get("_intermediate_feature_normalizer.rotation")
    return {
        "model": model,
        "model_kwargs": kwargs,
        "max_resolution": grid * patch,
        "num_cls_tokens": None if num_cls == len(names) > 1 else num_cls,
        "summary_tokens": names if num_cls == len(names) > 1 else None,
        "num_registers": int(state[PREFIX_TOKENS].shape[0]) - num_cls,
        "cpe_align_corners": bool(named.get("cpe_align_corners", False)),
        "feature_normalizer": "_feature_normalizer.mean" in state,
        "intermediate_normalizers": 0 if inter is None else int(inter.shape[0]),
        "intermediate_rotation_per_layer": rotation is not None and rotation.ndim == 3,
    }


class PublishedStudent(CPEViT):
    """A :class:`~radio_lit.students.CPEViT` with the architecture of the published model at
    ``source`` (see the module docstring); the training options are CPEViT's.

    Args:
        source: the published model's file or folder (as ``model.init_from`` takes it).
        spectral_reparam: σReparam on the blocks (CPEViT's).
        spectral_reparam_version: its version (NVlabs/RADIO: 2).
        cpe_min_scale: CPEViT's.
        cpe_max_aspect: CPEViT's.
        cpe_dropout: CPEViT's (C-RADIOv4: 0.1).
        vitdet_window_sizes: CPEViT's.
        vitdet_num_windowed: CPEViT's.
        vitdet_probability: CPEViT's.
    """

    def __init__(
        self,
        source: str,
        spectral_reparam: bool = True,
        spectral_reparam_version: Literal[1, 2] = 1,
        cpe_min_scale: float = 0.1**0.5,
        cpe_max_aspect: float = 4.0 / 3.0,
        cpe_dropout: float = 0.0,
        vitdet_window_sizes: list[int] | None = None,
        vitdet_num_windowed: int | None = None,
        vitdet_probability: float = 1.0,
    ) -> None:
        super().__init__(
            **published_architecture(read_published(source)),
            spectral_reparam=spectral_reparam,
            spectral_reparam_version=spectral_reparam_version,
            cpe_min_scale=cpe_min_scale,
            cpe_max_aspect=cpe_max_aspect,
            cpe_dropout=cpe_dropout,
            vitdet_window_sizes=vitdet_window_sizes,
            vitdet_num_windowed=vitdet_num_windowed,
            vitdet_probability=vitdet_probability,
        )
