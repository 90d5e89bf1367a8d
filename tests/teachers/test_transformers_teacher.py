"""TransformersTeacher's refusals and defaults that would otherwise give silently wrong targets:
a ``cls`` summary without a class token, pixel statistics other than the checkpoint's, a full
CLIPModel."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import Tensor
from transformers import CLIPConfig, CLIPModel, DINOv3ViTConfig, DINOv3ViTModel

from radio_lit.teachers import DINOv3Teacher, TransformersTeacher
from radio_lit.teachers.tokens import TokenLayout, TokenTeacher
from tests.teachers.tiny import TINY_DINOV3_HF_CONFIG, TINY_SIGLIP_HF_CONFIG

#: DINOv3's SAT-493M (satellite) weights' image processor statistics (its model card).
SAT_MEAN, SAT_STD = (0.430, 0.411, 0.296), (0.213, 0.156, 0.143)


def test_a_cls_summary_without_a_class_token_is_refused() -> None:
    """SigLIP has no class token: ``summary: cls`` would take its first patch token."""
    with pytest.raises(ValueError, match="has no class token; use summary: pooled"):
        TransformersTeacher(
            "siglip_vision_model",
            pretrained=False,
            model_kwargs=TINY_SIGLIP_HF_CONFIG,
            summary="cls",
        )


class _PatchesOnly(TokenTeacher):
    """A token teacher of an unknown family (prefix counted from the output) whose encoder
    returns patch tokens only."""

    def tokens(self, view: Tensor) -> tuple[Tensor, Tensor | None]:
        rows, cols = view.shape[-2] // 16, view.shape[-1] // 16
        return torch.zeros(len(view), rows * cols, 8), None


def test_a_cls_summary_of_an_output_without_prefix_tokens_is_refused(crop: Tensor) -> None:
    layout = TokenLayout(64, 16, (0.5,) * 3, (0.5,) * 3, 8, 8, "cls", None)
    with pytest.raises(RuntimeError, match="summary: cls on a model without a class token"):
        _PatchesOnly(layout, follow_student=False)(crop)


def test_pixel_statistics_come_from_the_checkpoints_image_processor(tmp_path: Path) -> None:
    """A DINOv3 checkpoint with its own statistics (SAT-493M) keeps them, not ImageNet's;
    without an image processor config the architecture's are used."""
    DINOv3ViTModel(DINOv3ViTConfig(**TINY_DINOV3_HF_CONFIG)).save_pretrained(tmp_path)
    assert DINOv3Teacher(str(tmp_path), backend="transformers").mean == pytest.approx(
        (0.485, 0.456, 0.406)
    )
    processor = {"image_mean": list(SAT_MEAN), "image_std": list(SAT_STD)}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(processor))
    for teacher in (
        DINOv3Teacher(str(tmp_path), backend="transformers"),
        TransformersTeacher(str(tmp_path)),
    ):
        assert teacher.mean == pytest.approx(SAT_MEAN) and teacher.std == pytest.approx(SAT_STD)


def test_a_full_clip_checkpoint_points_to_open_clip(tmp_path: Path) -> None:
    tiny = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2)
    config = CLIPConfig(
        text_config=tiny, vision_config={**tiny, "image_size": 32, "patch_size": 16}
    )
    CLIPModel(config).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="full CLIPModel.*OpenCLIPTeacher") as error:
        TransformersTeacher(str(tmp_path))
    assert "\n" not in str(error.value)
