"""SAM2Teacher and SAM3Teacher against transformers' Sam2VisionModel / Sam3VisionModel."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from transformers import Sam2VisionConfig, Sam2VisionModel, Sam3VisionConfig, Sam3VisionModel

from radio_lit.teachers.sam_hf import SAM2Teacher, SAM3Teacher
from tests.teachers.tiny import TINY_SAM2_CONFIG, TINY_SAM3_CONFIG

EXACT = dict(rtol=0, atol=1e-5)


def _captured(module: nn.Module, run) -> Tensor:
    captured: list = []
    handle = module.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        run()
    finally:
        handle.remove()
    return captured[-1]


def test_sam2_takes_hieras_stride16_stage_before_the_neck(tmp_path: Path, crop: Tensor) -> None:
    torch.manual_seed(1)
    source = Sam2VisionModel(Sam2VisionConfig(**TINY_SAM2_CONFIG)).eval()
    source.save_pretrained(tmp_path)
    teacher = SAM2Teacher(str(tmp_path), resolution=96)
    assert (teacher.canvas, teacher.patch_size, teacher.feature_dim) == (128, 16, 64)
    assert teacher.mean == pytest.approx((0.485, 0.456, 0.406))
    out = teacher(crop)
    assert out.summary is None
    padded = F.pad(teacher.view(crop), (0, 32, 0, 32))
    with torch.no_grad():
        full = source(pixel_values=padded)  # the library's whole forward, neck included
        stages = _captured(source.backbone, lambda: source(pixel_values=padded))
    assert full.fpn_hidden_states[0].shape[-1] == 32  # the neck's 4x upsampled level
    expected = stages.intermediate_hidden_states[2][:, :6, :6]
    torch.testing.assert_close(out.features, expected, **EXACT)


def test_sam2_level_and_mosaic() -> None:
    teacher = SAM2Teacher(
        "sam2_vision_model",
        pretrained=False,
        model_kwargs=TINY_SAM2_CONFIG,
        level=3,
        resolution=64,
        mosaic=True,
    )
    assert (teacher.patch_size, teacher.feature_dim) == (32, 128)
    assert teacher(torch.rand(5, 3, 64, 64)).features.shape == (5, 2, 2, 128)
    with pytest.raises(ValueError, match="level 4 is no Hiera stage; use 0 to 3"):
        SAM2Teacher("sam2_vision_model", pretrained=False, model_kwargs=TINY_SAM2_CONFIG, level=4)


def test_sam3_takes_the_vit_before_the_fpn_neck(tmp_path: Path, crop: Tensor) -> None:
    torch.manual_seed(1)
    source = Sam3VisionModel(Sam3VisionConfig(**TINY_SAM3_CONFIG)).eval()
    source.save_pretrained(tmp_path)
    teacher = SAM3Teacher(str(tmp_path), resolution=84)
    assert (teacher.canvas, teacher.patch_size, teacher.feature_dim) == (112, 14, 32)
    assert teacher.mean == teacher.std == (0.5, 0.5, 0.5)
    out = teacher(crop)
    padded = F.pad(teacher.view(crop), (0, 28, 0, 28))
    with torch.no_grad():
        ref = source(pixel_values=padded)
    expected = ref.last_hidden_state.reshape(2, 8, 8, 32)[:, :6, :6]
    torch.testing.assert_close(out.features, expected, **EXACT)


def test_sam3_mosaic_packs_four_views_per_canvas() -> None:
    teacher = SAM3Teacher(
        "sam3_vision_model",
        pretrained=False,
        model_kwargs=TINY_SAM3_CONFIG,
        resolution=56,
        mosaic=True,
    )
    calls = []
    teacher.model.register_forward_hook(lambda _m, inputs, _o: calls.append(inputs))
    assert teacher(torch.rand(4, 3, 56, 56)).features.shape == (4, 4, 4, 32)
    assert len(calls) == 1


def test_sam3_resolution_above_the_canvas_names_the_nearest_valid_one() -> None:
    with pytest.raises(ValueError, match="nearest valid resolution is 112"):
        SAM3Teacher(
            "sam3_vision_model", pretrained=False, model_kwargs=TINY_SAM3_CONFIG, resolution=128
        )


def test_sam2_from_a_whole_sam2_model_keeps_its_vision_encoder(tmp_path: Path) -> None:
    """facebook/sam2.1-* repositories hold the whole Sam2Model (prompt encoder, mask decoder)."""
    from transformers import Sam2Config, Sam2Model

    torch.manual_seed(1)
    source = Sam2Model(Sam2Config(vision_config=TINY_SAM2_CONFIG)).eval()
    source.save_pretrained(tmp_path)
    teacher = SAM2Teacher(str(tmp_path))
    images = torch.rand(1, 3, 128, 128, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        stages = source.vision_encoder.backbone(pixel_values=teacher.view(images))
    expected = stages.intermediate_hidden_states[2]
    torch.testing.assert_close(teacher(images).features, expected, **EXACT)
