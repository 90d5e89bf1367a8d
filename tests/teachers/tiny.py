"""Tiny teachers with the real architectures and random weights, for fast CPU tests.

Each teacher is described only by its constructor arguments (plain dicts below), so the same
numbers work in a YAML config and in Python (``tiny_*_teacher``). Reuse them from other test
folders with ``from tests.teachers.tiny import ...``.
"""

from __future__ import annotations

from typing import Any

from radio_lit.teachers import (
    DINOv2Teacher,
    DINOv3Teacher,
    OpenCLIPTeacher,
    SAM3Teacher,
    SAMTeacher,
    TransformersTeacher,
)

#: open_clip CLIP with an OpenAI-style ViT tower: 56 px, patch 14 -> 4x4 grid, width 64.
TINY_CLIP_CFG: dict[str, Any] = {
    "embed_dim": 32,
    "vision_cfg": {"image_size": 56, "layers": 2, "width": 64, "head_width": 32, "patch_size": 14},
    "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 32, "heads": 2, "layers": 1},
}

#: open_clip SigLIP-like model: timm tower (``test_vit3``: 1 register token, MAP pooling, no
#: projection), like ViT-SO400M-14-SigLIP-384. 160 px (test_vit3's size), patch 16 -> 10x10 grid,
#: width 96.
TINY_SIGLIP_CFG: dict[str, Any] = {
    "embed_dim": 96,
    "custom_text": True,
    "vision_cfg": {
        "image_size": 160,
        "timm_model_name": "test_vit3",
        "timm_pool": "map",
        "timm_proj": "none",
    },
    "text_cfg": {"context_length": 8, "vocab_size": 64, "width": 32, "heads": 2, "layers": 1},
}

#: transformers ``SiglipVisionConfig`` (SigLIP/SigLIP2's fixed-resolution tower, attention-pool
#: head) shrunk: 64 px, patch 16 -> 4x4 grid, width 48.
TINY_SIGLIP_HF_CONFIG: dict[str, Any] = {
    "hidden_size": 48,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 64,
    "patch_size": 16,
}

#: timm ``vit_small_patch14_reg4_dinov2`` shrunk: 56 px -> 4x4 grid, width 48, 4 registers.
TINY_DINOV2_TIMM_KWARGS: dict[str, Any] = {
    "depth": 2,
    "embed_dim": 48,
    "num_heads": 2,
    "img_size": 56,
}

#: transformers ``Dinov2WithRegistersConfig`` overrides: 56 px -> 4x4 grid, width 32.
TINY_DINOV2_HF_CONFIG: dict[str, Any] = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "mlp_ratio": 2,
    "image_size": 56,
    "patch_size": 14,
    "num_register_tokens": 4,
}

#: timm ``vit_small_patch16_dinov3`` (EVA blocks, RoPE, CLS + 4 registers) shrunk: 64 px ->
#: 4x4 grid, width 32.
TINY_DINOV3_TIMM_KWARGS: dict[str, Any] = {
    "depth": 2,
    "embed_dim": 32,
    "num_heads": 2,
    "img_size": 64,
}

#: transformers ``DINOv3ViTConfig`` shrunk: 64 px -> 4x4 grid, width 32, 4 registers.
TINY_DINOV3_HF_CONFIG: dict[str, Any] = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 64,
    "patch_size": 16,
    "num_register_tokens": 4,
}

#: transformers ``Sam2VisionConfig`` (Hiera) shrunk: 128 px canvas, stages at strides 4-32,
#: widths 16-128; stage 2 (stride 16) -> 8x8 grid of width 64.
TINY_SAM2_CONFIG: dict[str, Any] = {
    "backbone_config": {
        "model_type": "sam2_hiera_det_model",
        "image_size": [128, 128],
        "hidden_size": 16,
        "blocks_per_stage": [1, 1, 2, 1],
        "embed_dim_per_stage": [16, 32, 64, 128],
        "num_attention_heads_per_stage": [1, 1, 2, 2],
        "window_size_per_stage": [4, 4, 4, 2],
        "global_attention_blocks": [3],
        "window_positional_embedding_background_size": [4, 4],
    },
    "backbone_channel_list": [128, 64, 32, 16],
    "backbone_feature_sizes": [[32, 32], [16, 16], [8, 8]],
    "fpn_hidden_size": 32,
}

#: transformers ``Sam3VisionConfig`` (ViT backbone + FPN neck) shrunk: 112 px canvas, patch 14
#: -> 8x8 grid, width 32, windows of 4 and one global block.
TINY_SAM3_CONFIG: dict[str, Any] = {
    "backbone_config": {
        "model_type": "sam3_vit_model",
        "image_size": 112,
        "pretrain_image_size": 56,
        "patch_size": 14,
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "window_size": 4,
        "global_attn_indexes": [1],
    },
    "fpn_hidden_size": 16,
}

#: SAM ViTDet encoder shrunk: 128 px input, patch 16 -> 8x8 grid, windows of 4, width 32.
TINY_SAM_ENCODER: dict[str, Any] = {
    "img_size": 128,
    "patch_size": 16,
    "embed_dim": 32,
    "depth": 2,
    "num_heads": 2,
    "window_size": 4,
    "global_attn_indexes": [1],
    "use_rel_pos": True,
    "out_chans": 16,
}


def tiny_clip_teacher(**overrides: Any) -> OpenCLIPTeacher:
    """Tiny OpenAI-style CLIP teacher, random weights unless ``pretrained`` is given."""
    return OpenCLIPTeacher("radio-lit-tiny-clip", model_cfg=TINY_CLIP_CFG, **overrides)


def tiny_siglip_teacher(**overrides: Any) -> OpenCLIPTeacher:
    """Tiny SigLIP-like (timm tower) teacher."""
    return OpenCLIPTeacher("radio-lit-tiny-siglip", model_cfg=TINY_SIGLIP_CFG, **overrides)


def tiny_dinov2_teacher(**overrides: Any) -> DINOv2Teacher:
    """Tiny timm DINOv2-with-registers teacher (random weights unless ``checkpoint``)."""
    return DINOv2Teacher(
        "vit_small_patch14_reg4_dinov2",
        pretrained=False,
        model_kwargs=TINY_DINOV2_TIMM_KWARGS,
        **overrides,
    )


def tiny_hf_dinov2_teacher(**overrides: Any) -> DINOv2Teacher:
    """Tiny transformers DINOv2-with-registers teacher (random weights)."""
    return DINOv2Teacher(
        "dinov2_with_registers",
        backend="transformers",
        pretrained=False,
        model_kwargs=TINY_DINOV2_HF_CONFIG,
        **overrides,
    )


def tiny_sam_teacher(resolution: int | None = 96, **overrides: Any) -> SAMTeacher:
    """Tiny SAM teacher; the default 96 px view is padded to the encoder's 128 px."""
    return SAMTeacher(encoder_kwargs=TINY_SAM_ENCODER, resolution=resolution, **overrides)


def tiny_dinov3_teacher(**overrides: Any) -> DINOv3Teacher:
    """Tiny timm DINOv3 teacher (EVA blocks, RoPE, 4 registers; random weights)."""
    return DINOv3Teacher(
        "vit_small_patch16_dinov3",
        pretrained=False,
        model_kwargs=TINY_DINOV3_TIMM_KWARGS,
        **overrides,
    )


def tiny_hf_siglip_teacher(**overrides: Any) -> TransformersTeacher:
    """Tiny transformers SiglipVisionModel teacher (random weights)."""
    return TransformersTeacher(
        "siglip_vision_model", pretrained=False, model_kwargs=TINY_SIGLIP_HF_CONFIG, **overrides
    )


def tiny_sam3_teacher(resolution: int | None = 84, **overrides: Any) -> SAM3Teacher:
    """Tiny transformers SAM3 teacher; the default 84 px view is padded to 112 px."""
    return SAM3Teacher(
        "sam3_vision_model",
        pretrained=False,
        model_kwargs=TINY_SAM3_CONFIG,
        resolution=resolution,
        **overrides,
    )


def tiny_teacher_configs(sam_resolution: int = 96) -> dict[str, dict[str, Any]]:
    """The tiny CLIP, DINOv2 and SAM teachers as a config file spells them (``class_path`` /
    ``init_args``), keyed ``clip``, ``dino``, ``sam``."""
    return {
        "clip": {
            "class_path": "radio_lit.teachers.OpenCLIPTeacher",
            "init_args": {"model_name": "radio-lit-tiny-clip", "model_cfg": TINY_CLIP_CFG},
        },
        "dino": {
            "class_path": "radio_lit.teachers.DINOv2Teacher",
            "init_args": {
                "model": "vit_small_patch14_reg4_dinov2",
                "pretrained": False,
                "model_kwargs": TINY_DINOV2_TIMM_KWARGS,
            },
        },
        "sam": {
            "class_path": "radio_lit.teachers.SAMTeacher",
            "init_args": {"encoder_kwargs": TINY_SAM_ENCODER, "resolution": sam_resolution},
        },
    }
