"""What NVIDIA's own files and loader hold that radio-lit's reader and writer must meet, each
fact checked where radio-lit reads or writes it (NVlabs/RADIO at c0f3701, 2026-05-29: read for
the facts only; its code is not copied)."""

from __future__ import annotations

import timm
import torch

from radio_lit.export.layout import BASE, from_radio_keys, trunk_from_radio
from radio_lit.export.model import unused_timm_parameters
from radio_lit.export.published import NVLABS_MODELS, _published, timm_architecture

#: radio/extra_timm_models.py's ``model_args`` (width, depth, heads, MLP hidden, patch) of each
#: model NVlabs registers in timm itself; its MLP hidden is timm's ``int(width * mlp_ratio)``.
NVLABS_ARCHITECTURES = {
    "vit_tiny_patch14_224": (192, 12, 3, 768, 14),
    "vit_small_patch14_224": (384, 12, 6, 1536, 14),
    "vit_base_patch14_224": (768, 12, 12, 3072, 14),
    "vit_base_patch16_v2_224": (768, 12, 12, 3072, 16),
    "vit_large_patch16_v2_224": (1024, 24, 16, 4096, 16),
    "vit_so400m_patch16_224": (1152, 27, 16, int(1152 * (4304 / 1152)), 16),
    "vit_so400m_v2_patch16_224": (1152, 27, 16, int(1152 * (4320 / 1152)), 16),
    "vit_huge_patch16_224": (1280, 32, 16, 5120, 16),
    "vit_giant_patch16_224": (1536, 40, 24, 6144, 16),
    "vit_bigG_patch14_224": (1664, 48, 16, 6656, 14),
}


def test_every_nvlabs_only_model_name_is_the_timm_model_it_registers():
    """``args.model`` of NVIDIA's files may name a model only NVlabs' code registers in timm
    (C-RADIOv3-H/v4-H: ``vit_huge_patch16_224``, SO400M: ``vit_so400m_patch16_224``); read, it
    is a model timm builds with NVlabs' widths (and LayerScale for the ``v2``/bigG ones)."""
    assert NVLABS_MODELS.keys() == NVLABS_ARCHITECTURES.keys()
    for name, (width, depth, heads, hidden, patch) in NVLABS_ARCHITECTURES.items():
        model, kwargs = timm_architecture(name, {})
        assert model in timm.list_models(), name
        with torch.device("meta"):
            vit = timm.create_model(model, pretrained=False, weight_init="skip", **kwargs)
        block = vit.blocks[0]
        got = (vit.embed_dim, len(vit.blocks), block.attn.num_heads, block.mlp.fc1.out_features)
        assert (*got, vit.patch_embed.patch_size[0]) == (width, depth, heads, hidden, patch), name
        layer_scale = type(block.ls1).__name__ == "LayerScale"
        assert layer_scale == (name.endswith("v2_224") and "so400m" not in name or "bigG" in name)
    assert timm_architecture("vit_huge_patch16_224", {"depth": 2}) == (
        "vit_huge_patch14_224", {"patch_size": 16, "depth": 2}  # the file's own kwargs win
    )  # fmt: skip


def test_layer_scale_saved_as_grandma_reads_as_timms_gamma():
    """radio/dinov2_arch.py ``LayerScale`` names its parameter ``grandma`` (C-RADIOv3-B/L's
    files), timm ``gamma``."""
    state = {
        BASE + "patch_generator.embedder.weight": torch.zeros(8, 3 * 4 * 4),
        BASE + "patch_generator.pos_embed": torch.zeros(1, 16, 8),
        BASE + "patch_generator.cls_token.token": torch.zeros(1, 8),
        BASE + "blocks.0.ls1.grandma": torch.full((8,), 0.1),
        BASE + "blocks.0.ls2.grandma": torch.full((8,), 0.2),
    }
    trunk = trunk_from_radio(state, 1, patch_bias=False)
    assert torch.equal(trunk["blocks.0.ls1.gamma"], state[BASE + "blocks.0.ls1.grandma"])
    assert torch.equal(trunk["blocks.0.ls2.gamma"], state[BASE + "blocks.0.ls2.grandma"])
    assert not any(k.endswith("grandma") for k in trunk)


def test_summary_tokens_are_counted_over_unique_teacher_names():
    """radio/radio_model.py ``create_model_from_args``: ``num_cls_tokens = len(set(names))``
    with ``cls_token_per_teacher`` (a teacher listed twice, e.g. at two resolutions, shares
    its token)."""
    teachers = [{"name": n, "type": "generic"} for n in ("clip", "clip", "dino")]
    state = {
        BASE + "patch_generator.embedder.weight": torch.zeros(8, 48),
        BASE + "patch_generator.pos_embed": torch.zeros(1, 16, 8),
        BASE + "patch_generator.cls_token.token": torch.zeros(2, 8),
    }
    args = {"model": "vit_tiny_patch16_224", "cls_token_per_teacher": True, "teachers": teachers}
    assert _published(None, "NVlabs checkpoint", args, state).num_cls_tokens == 2


def test_timms_unused_register_token_is_written_for_nvlabs_loader_and_dropped_on_read():
    """NVlabs' loader builds ``args.model`` with timm (``vit_*_radio_v4`` has a
    ``reg_token [1, 9, D]``), its CPE leaves that parameter unused, and ``load_state_dict``
    warns of a missing key unless the file holds it."""
    config = {"model": "vit_so400m_patch16_radio_v4", "model_kwargs": {"depth": 1}}
    unused = unused_timm_parameters(config)
    assert {k: tuple(v.shape) for k, v in unused.items()} == {BASE + "reg_token": (1, 9, 1152)}
    assert from_radio_keys(unused) == {}
    plain = {"model": "vit_tiny_patch16_224", "model_kwargs": {"depth": 1}}
    assert unused_timm_parameters(plain) == {}
