"""DINOv3 teachers from timm or transformers (C-RADIOv4 distills DINOv3-7B).

DINOv3 ViTs (Siméoni et al., 2025) have 16 px patches, a CLS token, 4 register tokens and
rotary position embeddings (RoPE) instead of a learned position table, so they run at any
resolution that is a multiple of 16 without interpolation: a natural ``follow_student``
teacher. timm builds them as ``Eva`` models (EVA blocks with RoPE); transformers as
``DINOv3ViTModel``.
"""

from __future__ import annotations

from radio_lit.teachers.backends import TwoBackendTeacher


class DINOv3Teacher(TwoBackendTeacher):
    """Frozen DINOv3 ViT from timm or transformers.

    Reference models: timm ``vit_small_patch16_dinov3``, ``vit_base_patch16_dinov3``,
    ``vit_large_patch16_dinov3``, ``vit_huge_plus_patch16_dinov3``, ``vit_7b_patch16_dinov3``
    (``.lvd1689m`` tags); transformers ``facebook/dinov3-vitl16-pretrain-lvd1689m`` …
    ``facebook/dinov3-vit7b16-pretrain-lvd1689m`` (gated repositories: accept the licence on
    the hub, then download and give the directory).

    Outputs for a view ``[B, 3, H, W]``: ``summary`` ``[B, C]`` (the CLS token after the
    final norm) and ``features`` ``[B, H/16, W/16, C]`` (the normed patch tokens, CLS and the
    4 registers dropped). With ``follow_student`` the view is the student's grid times 16
    pixels, whatever its size (RoPE).

    Args: as :class:`~radio_lit.teachers.DINOv2Teacher` (``model``: a timm name from
    ``timm.list_models('*dinov3*')``, or an HF id / directory / the model type
    ``"dinov3_vit"`` with the transformers backend).
    """

    model_types = ("dinov3_vit",)
    timm_pattern = "*dinov3*"
    wrong_family = (("dinov2", "DINOv2Teacher"),)
