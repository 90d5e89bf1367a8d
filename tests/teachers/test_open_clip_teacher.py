"""OpenCLIPTeacher against open_clip itself, on tiny CLIP and SigLIP-like models."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import open_clip
import pytest
import torch
from torch import Tensor, nn

from radio_lit.teachers import OpenCLIPTeacher
from radio_lit.teachers.open_clip import _whole_patches
from tests.teachers.tiny import (
    TINY_CLIP_CFG,
    TINY_SIGLIP_CFG,
    tiny_clip_teacher,
    tiny_siglip_teacher,
)


def _saved_model(model_cfg: dict[str, Any], path: Path) -> nn.Module:
    """A random open_clip model built directly from its classes, saved to ``path``."""
    cfg = dict(model_cfg)
    model_class = open_clip.CustomTextCLIP if cfg.pop("custom_text", False) else open_clip.CLIP
    torch.manual_seed(1)
    model = model_class(**cfg).eval()
    torch.save(model.state_dict(), path)
    return model


def _captured_output(module: nn.Module, run: Callable[[], Any]) -> Tensor:
    """Output of ``module`` while ``run()`` executes."""
    captured: list[Tensor] = []
    handle = module.register_forward_hook(lambda _m, _i, out: captured.append(out))
    try:
        run()
    finally:
        handle.remove()
    return captured[-1]


@pytest.mark.parametrize(
    ("model_cfg", "build", "final_norm"),
    [
        (TINY_CLIP_CFG, tiny_clip_teacher, lambda visual: visual.ln_post),
        (TINY_SIGLIP_CFG, tiny_siglip_teacher, lambda visual: visual.trunk.norm),
    ],
    ids=["openai_style", "timm_tower"],
)
def test_checkpoint_file_summary_and_features_match_open_clip(
    model_cfg: dict[str, Any],
    build: Callable[..., OpenCLIPTeacher],
    final_norm: Callable[[nn.Module], nn.Module],
    tmp_path: Path,
    crop: Tensor,
    caplog: pytest.LogCaptureFixture,
) -> None:
    source = _saved_model(model_cfg, tmp_path / "tiny.pt")
    with caplog.at_level(logging.WARNING):
        teacher = build(pretrained=str(tmp_path / "tiny.pt"))
    # open_clip's "No pretrained weights loaded ... initialized randomly" would be wrong here
    assert not [r for r in caplog.records if "pretrained" in r.getMessage()], caplog.text

    expected = source.visual.state_dict()
    loaded = teacher.model.state_dict()
    assert loaded.keys() == expected.keys()
    assert all(torch.equal(loaded[k], expected[k]) for k in expected)

    view = teacher.view(crop)
    out = teacher(crop)
    with torch.no_grad():
        tokens = _captured_output(final_norm(source.visual), lambda: source.encode_image(view))
        embedding = source.encode_image(view)
    torch.testing.assert_close(out.summary, embedding)
    side = teacher.grid_size[0]
    assert tokens.shape[1] == 1 + side * side  # one class (CLIP) or register (test_vit3) token
    torch.testing.assert_close(out.features, tokens[:, 1:].reshape(2, side, side, -1))


def test_geometry_and_pixel_statistics_come_from_the_model() -> None:
    teacher = tiny_clip_teacher()
    assert (teacher.resolution, teacher.patch_size, teacher.grid_size) == (56, 14, (4, 4))
    assert (teacher.feature_dim, teacher.summary_dim) == (64, 32)
    assert teacher.mean == pytest.approx(open_clip.OPENAI_DATASET_MEAN)
    assert teacher.std == pytest.approx(open_clip.OPENAI_DATASET_STD)
    siglip = tiny_siglip_teacher(mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5))
    assert (siglip.resolution, siglip.patch_size, siglip.feature_dim) == (160, 16, 96)
    assert siglip.mean == siglip.std == (0.5, 0.5, 0.5)


@pytest.mark.parametrize("build", [tiny_clip_teacher, tiny_siglip_teacher], ids=["vit", "timm"])
def test_resolution_rebuilds_the_tower(build: Callable[..., OpenCLIPTeacher], crop: Tensor) -> None:
    teacher = build(resolution=112)
    assert teacher.grid_size == (112 // teacher.patch_size,) * 2
    assert teacher(crop).features.shape[1:3] == teacher.grid_size


def test_default_resolution_drops_partial_patches(crop: Tensor) -> None:
    # like SigLIP-384 with 14 px patches (27x27 grid, 378 px): a 60 px tower has a 4x4 grid
    cfg = {**TINY_CLIP_CFG, "vision_cfg": {**TINY_CLIP_CFG["vision_cfg"], "image_size": 60}}
    teacher = OpenCLIPTeacher("radio-lit-tiny-clip-60", model_cfg=cfg)
    assert (teacher.resolution, teacher.grid_size) == (56, (4, 4))
    assert teacher(crop).features.shape == (2, 4, 4, 64)


def test_timm_trunk_is_told_the_whole_patch_size() -> None:
    cfg = {k: v for k, v in TINY_SIGLIP_CFG.items() if k != "custom_text"}
    visual = open_clip.CustomTextCLIP(**cfg).visual
    visual.set_input_size(170)  # 10x10 grid of 16 px patches, 10 px unused
    pos_embed = visual.trunk.pos_embed.clone()
    assert _whole_patches(visual, 170, 16) == 160
    assert torch.equal(visual.trunk.pos_embed, pos_embed)
    assert visual.trunk.forward_features(torch.rand(1, 3, 160, 160)).shape == (1, 1 + 100, 96)


def test_text_tower_dropped_unless_kept() -> None:
    teacher = tiny_clip_teacher()
    assert teacher.clip is None
    assert {id(p) for p in teacher.parameters()} == {id(p) for p in teacher.model.parameters()}
    with_text = tiny_clip_teacher(keep_text=True)
    assert with_text.clip.visual is with_text.model
    tokens = torch.zeros(1, TINY_CLIP_CFG["text_cfg"]["context_length"], dtype=torch.long)
    assert with_text.clip.encode_text(tokens).shape == (1, TINY_CLIP_CFG["embed_dim"])
    assert not any(p.requires_grad for p in with_text.parameters())
    assert with_text.state_dict() == {}


def test_model_cfg_is_registered_only_while_building() -> None:
    tiny_clip_teacher()
    assert "radio-lit-tiny-clip" not in open_clip.list_models()


def test_unknown_model_name_says_how_to_list_models() -> None:
    with pytest.raises(
        ValueError,
        match=r"unknown open_clip model 'ViT-L-14-33'.*ViT-L-14-336.*"
        r"open_clip\.list_models\(\)",
    ):
        OpenCLIPTeacher("ViT-L-14-33", pretrained="openai")


def test_unknown_pretrained_value_lists_tags() -> None:
    with pytest.raises(ValueError, match=r"neither a local file nor a pretrained tag.*'openai'"):
        OpenCLIPTeacher("ViT-L-14-336", pretrained="/no/such/checkpoint.bin")


def test_model_cfg_with_a_hub_name_is_rejected() -> None:
    with pytest.raises(ValueError, match="model_cfg"):
        OpenCLIPTeacher("hf-hub:org/repo", model_cfg=TINY_CLIP_CFG)
