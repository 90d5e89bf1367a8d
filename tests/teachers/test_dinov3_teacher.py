"""DINOv3Teacher against timm's Eva and transformers' DINOv3ViTModel, on tiny random models."""

from __future__ import annotations

from pathlib import Path

import pytest
import timm
import torch
import transformers
from torch import Tensor
from transformers import DINOv3ViTConfig, DINOv3ViTModel

from radio_lit.teachers import DINOv2Teacher, DINOv3Teacher, TimmTeacher
from tests.teachers.tiny import TINY_DINOV3_HF_CONFIG, TINY_DINOV3_TIMM_KWARGS

PREFIX = 1 + 4  # CLS + 4 registers
EXACT = dict(rtol=0, atol=1e-5)


def _images(height: int, width: int) -> Tensor:
    return torch.rand(2, 3, height, width, generator=torch.Generator().manual_seed(4))


def test_timm_checkpoint_matches_timm_forward(tmp_path: Path) -> None:
    torch.manual_seed(1)
    source = timm.create_model("vit_small_patch16_dinov3", **TINY_DINOV3_TIMM_KWARGS).eval()
    torch.save(source.state_dict(), tmp_path / "dinov3.pth")
    teacher = DINOv3Teacher(
        "vit_small_patch16_dinov3",
        checkpoint=str(tmp_path / "dinov3.pth"),  # meta-built, weights assigned
        model_kwargs=TINY_DINOV3_TIMM_KWARGS,
        follow_student=True,
    )
    assert (teacher.patch_size, teacher.num_prefix_tokens, teacher.feature_dim) == (16, 5, 32)
    images = _images(48, 80)  # any multiple of 16: RoPE
    size = teacher.view_size((3, 5))
    assert size == (48, 80)
    out = teacher(images, size)
    with torch.no_grad():
        tokens = source.forward_features(teacher.view(images, size))
    torch.testing.assert_close(out.summary, tokens[:, 0], **EXACT)
    torch.testing.assert_close(out.features, tokens[:, PREFIX:].reshape(2, 3, 5, 32), **EXACT)


def test_transformers_directory_matches_dinov3vit_forward(tmp_path: Path) -> None:
    torch.manual_seed(1)
    source = DINOv3ViTModel(DINOv3ViTConfig(**TINY_DINOV3_HF_CONFIG)).eval()
    source.save_pretrained(tmp_path)
    teacher = DINOv3Teacher(str(tmp_path), backend="transformers", follow_student=True)
    assert teacher.mean == pytest.approx((0.485, 0.456, 0.406))
    images = _images(64, 96)
    out = teacher(images, (64, 96))
    with torch.no_grad():
        ref = source(pixel_values=teacher.view(images, (64, 96)))
    torch.testing.assert_close(out.summary, ref.pooler_output, **EXACT)
    features = ref.last_hidden_state[:, PREFIX:].reshape(2, 4, 6, 32)
    torch.testing.assert_close(out.features, features, **EXACT)


def test_generic_timm_teacher_reads_the_layout_from_the_model() -> None:
    teacher = TimmTeacher(
        "vit_small_patch16_dinov3", pretrained=False, model_kwargs=TINY_DINOV3_TIMM_KWARGS
    )
    assert (teacher.resolution, teacher.patch_size, teacher.num_prefix_tokens) == (64, 16, 5)
    assert teacher.summary_source == "cls"
    assert teacher.mean == pytest.approx((0.485, 0.456, 0.406))


def test_bfloat16_teacher_returns_float32_close_to_float32() -> None:
    torch.manual_seed(1)
    full = DINOv3Teacher(
        "vit_small_patch16_dinov3", pretrained=False, model_kwargs=TINY_DINOV3_TIMM_KWARGS
    )
    half = DINOv3Teacher(
        "vit_small_patch16_dinov3",
        pretrained=False,
        model_kwargs=TINY_DINOV3_TIMM_KWARGS,
        dtype="bfloat16",
    )
    half.model.load_state_dict(full.model.state_dict())
    assert next(half.parameters()).dtype == torch.bfloat16
    images = _images(64, 64)
    a, b = full(images), half(images)
    assert b.features.dtype == torch.float32
    torch.testing.assert_close(b.features, a.features, rtol=0.1, atol=0.1)


def test_dinov2_teacher_refuses_a_dinov3_id_before_any_download(monkeypatch) -> None:
    def no_network(*args, **kwargs):
        raise AssertionError("went to the hub")

    monkeypatch.setattr(transformers.AutoConfig, "from_pretrained", no_network)
    with pytest.raises(ValueError, match="use radio_lit.teachers.DINOv3Teacher"):
        DINOv2Teacher("facebook/dinov3-vitl16-pretrain-lvd1689m", backend="transformers")
    with pytest.raises(ValueError, match="use radio_lit.teachers.DINOv3Teacher"):
        DINOv2Teacher("vit_large_patch16_dinov3.lvd1689m")


def test_undownloadable_id_names_teacher_id_and_local_route(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(OSError) as error:
        DINOv3Teacher("facebook/dinov3-vit7b16-pretrain-lvd1689m", backend="transformers")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("DINOv3Teacher: cannot fetch 'facebook/dinov3-vit7b16-pretrain")
    assert "save_pretrained" in message and "HF_HUB_OFFLINE=1" in message


def test_a_resolution_off_the_patch_grid_names_the_nearest_valid_one() -> None:
    kwargs = {k: v for k, v in TINY_DINOV3_TIMM_KWARGS.items() if k != "img_size"}
    with pytest.raises(
        ValueError,
        match="resolution 100 is not a multiple of the patch size 16; the nearest valid one is 96",
    ):
        DINOv3Teacher(
            "dinov3_vit",
            backend="transformers",
            pretrained=False,
            resolution=100,
            model_kwargs={**TINY_DINOV3_HF_CONFIG},
        )
    assert DINOv3Teacher(
        "vit_small_patch16_dinov3", pretrained=False, resolution=96, model_kwargs=kwargs
    ).grid_size == (6, 6)
