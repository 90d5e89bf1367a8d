"""SigLIP2 teachers: open_clip (statistics by architecture) and transformers SiglipVisionModel."""

from __future__ import annotations

from pathlib import Path

import open_clip
import pytest
import torch
from torch import Tensor
from transformers import SiglipConfig, SiglipModel, SiglipVisionConfig, SiglipVisionModel

from radio_lit.teachers import OpenCLIPTeacher, TransformersTeacher
from radio_lit.teachers.open_clip import pixel_stats
from tests.teachers.test_open_clip_teacher import _saved_model
from tests.teachers.tiny import TINY_SIGLIP_CFG, TINY_SIGLIP_HF_CONFIG, tiny_siglip_teacher

SIGLIP = ((0.5, 0.5, 0.5), (0.5, 0.5, 0.5))
SIGLIP2_NAMES = ["ViT-B-16-SigLIP2", "ViT-SO400M-16-SigLIP2-384", "ViT-gopt-16-SigLIP2-384"]


@pytest.mark.parametrize("name", SIGLIP2_NAMES)
def test_siglip2_from_a_local_file_gets_siglip_statistics(name: str, tmp_path: Path) -> None:
    """open_clip alone gives a model loaded from a file OpenAI CLIP's mean/std."""
    weights = tmp_path / "weights.safetensors"
    weights.touch()
    with torch.device("meta"):  # the real architecture, no memory
        model = open_clip.create_model(name, device="meta")
    assert open_clip.get_model_preprocess_cfg(model)["mean"] == open_clip.OPENAI_DATASET_MEAN
    assert pixel_stats(name, str(weights), None, model) == SIGLIP
    assert pixel_stats(name, None, None, model) == SIGLIP


def test_openai_style_from_a_local_file_keeps_openai_statistics(tmp_path: Path) -> None:
    weights = tmp_path / "weights.pt"
    weights.touch()
    with torch.device("meta"):
        model = open_clip.create_model("ViT-B-16", device="meta")
    mean, std = pixel_stats("ViT-B-16", str(weights), None, model)
    assert mean == pytest.approx(open_clip.OPENAI_DATASET_MEAN)
    assert std == pytest.approx(open_clip.OPENAI_DATASET_STD)


def test_siglip_like_teacher_from_a_file_gets_its_trunks_statistics(tmp_path: Path) -> None:
    _saved_model(TINY_SIGLIP_CFG, tmp_path / "tiny.pt")
    teacher = tiny_siglip_teacher(pretrained=str(tmp_path / "tiny.pt"))
    assert (teacher.mean, teacher.std) == SIGLIP


def _pixels(side: int) -> Tensor:
    return torch.rand(2, 3, side, side, generator=torch.Generator().manual_seed(2))


def test_transformers_siglip_matches_the_library(tmp_path: Path, crop: Tensor) -> None:
    torch.manual_seed(1)
    source = SiglipVisionModel(SiglipVisionConfig(**TINY_SIGLIP_HF_CONFIG)).eval()
    source.save_pretrained(tmp_path)
    teacher = TransformersTeacher(str(tmp_path))
    assert (teacher.mean, teacher.std) == SIGLIP
    assert (teacher.resolution, teacher.patch_size, teacher.num_prefix_tokens) == (64, 16, 0)
    view = teacher.view(crop)
    out = teacher(crop)
    with torch.no_grad():
        ref = source(pixel_values=view)
    torch.testing.assert_close(out.summary, ref.pooler_output, rtol=0, atol=1e-5)
    features = ref.last_hidden_state.reshape(2, 4, 4, -1)
    torch.testing.assert_close(out.features, features, rtol=0, atol=1e-5)


def test_transformers_siglip_full_checkpoint_runs_its_image_tower(tmp_path: Path) -> None:
    torch.manual_seed(1)
    text = {
        "hidden_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "vocab_size": 64,
        "max_position_embeddings": 8,
    }
    source = SiglipModel(SiglipConfig(text_config=text, vision_config=TINY_SIGLIP_HF_CONFIG))
    source.eval().save_pretrained(tmp_path)
    teacher = TransformersTeacher(str(tmp_path), resolution=96)  # position table interpolated
    images = _pixels(96)
    view = teacher.view(images)
    with torch.no_grad():
        embedding = source.get_image_features(pixel_values=view, interpolate_pos_encoding=True)
    embedding = getattr(embedding, "pooler_output", embedding)
    out = teacher(images)
    torch.testing.assert_close(out.summary, embedding, rtol=0, atol=1e-5)
    assert out.features.shape == (2, 6, 6, 48)


def test_naflex_siglip2_is_refused_with_the_reason() -> None:
    with pytest.raises(ValueError, match="NaFlex.*variable-length.*google/siglip2-"):
        TransformersTeacher("siglip2_vision_model", pretrained=False)


def test_generic_transformers_teacher_counts_prefix_tokens_from_the_output(
    tmp_path: Path, crop: Tensor
) -> None:
    from transformers import ViTConfig, ViTModel

    torch.manual_seed(1)
    config = ViTConfig(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        image_size=64,
        patch_size=16,
    )
    source = ViTModel(config).eval()
    source.save_pretrained(tmp_path)
    teacher = TransformersTeacher(
        str(tmp_path), summary="cls", mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5)
    )
    assert teacher.num_prefix_tokens is None  # a ViT's CLS token is found in its output
    with torch.no_grad():
        tokens = source(pixel_values=teacher.view(crop)).last_hidden_state
    out = teacher(crop)
    torch.testing.assert_close(out.summary, tokens[:, 0], rtol=0, atol=1e-5)
    torch.testing.assert_close(out.features, tokens[:, 1:].reshape(2, 4, 4, 32), rtol=0, atol=1e-5)


def test_an_undownloadable_tag_names_the_teacher_and_the_local_route(monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)
    with pytest.raises(OSError) as error:
        OpenCLIPTeacher("ViT-B-16-SigLIP2", pretrained="webli")
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("OpenCLIPTeacher: cannot fetch 'ViT-B-16-SigLIP2'")
    assert "local checkpoint file as pretrained" in message
