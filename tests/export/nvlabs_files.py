"""Files laid out as NVIDIA's released RADIO files are, key by key and argument by argument,
with tiny random weights: the conformance fixtures of ``model.init_from``.

Written from the facts of NVlabs/RADIO (read, not copied: it is non-commercial; commit
c0f37017930e9dda53f93424cf4bf39fc51f287e), timm 1.0.31 and transformers, never with radio-lit's
own exporter. Each fact used is cited where it is used. The trunks are tiny (``model_kwargs``
override the widths, which NVlabs' ``radio_model.create_model_from_args`` passes to
``timm.create_model``); everything else (names, token layout, LayerScale, norms, normalizers,
adaptor MLP names, ``args`` fields) is as the family's files hold it.
"""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path
from typing import Any

import timm
import torch
from torch import Tensor

#: Tiny widths (every family): ``model_kwargs`` win over the model function's own
#: (NVlabs ``radio/extra_timm_models.py``: ``dict(model_args, **kwargs)``).
TINY = {"depth": 2, "embed_dim": 32, "num_heads": 2}
PATCH, CPE_MAX = 16, 128
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # timm OPENAI_CLIP_MEAN (C-RADIO's cfg)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

#: NVlabs-only model names -> the timm ViT and widths they build (``radio/extra_timm_models.py``:
#: each function's ``model_args``, passed to timm's ``_create_vision_transformer``; the ``v2``
#: models have ``init_values=1e-5``, i.e. LayerScale). The test's own copy of the facts.
NVLABS_ONLY = {
    # built on timm's *_reg4_dinov2 with reg_tokens=4: an unused reg_token in the state dict
    "vit_base_patch16_v2_224": {"init_values": 1e-5, "reg_tokens": 4, "no_embed_class": True},
    "vit_large_patch16_v2_224": {"init_values": 1e-5, "reg_tokens": 4, "no_embed_class": True},
    "vit_huge_patch16_224": {},
    "vit_giant_patch16_224": {},
    "vit_so400m_patch16_224": {"mlp_ratio": 4304 / 1152},
}

#: The families. ``layer_scale``: the trunk has LayerScale, which NVlabs' ``extra_timm_models.
#: _patch_layer_scale`` replaces with ``dinov2_arch.LayerScale`` and so saves as
#: ``ls<k>.grandma`` (timm ``_convert_radio``: ``k.replace('.grandma', '.gamma')``).
#: ``prefix``: summary tokens + registers (timm ``vit_*_patch16_radio_v3``: ``reg_tokens=7``, 8
#: prefix tokens; ``*_radio_v4``: ``reg_tokens=9``, 10 = 3 summary + 7 registers). ``model_norm``:
#: False where timm's ``*_radio_v*`` say ``final_norm=False``. ``[assumption]`` where no code says
#: it: RADIOv2.5's args.model (the issue's "likely" for B/L), its prefix count, and C-RADIOv3's
#: split of its 8 prefix tokens into summary tokens and registers.
FAMILIES: dict[str, dict[str, Any]] = {
    "radio_v2.5-b": {"model": "vit_base_patch16_v2_224", "layer_scale": True, "prefix": 8,
                     "model_norm": False, "mean": CLIP_MEAN, "std": CLIP_STD},
    "radio_v2.5-l": {"model": "vit_large_patch16_v2_224", "layer_scale": True, "prefix": 8,
                     "model_norm": False, "mean": CLIP_MEAN, "std": CLIP_STD},
    "radio_v2.5-h": {"model": "vit_huge_patch16_224", "layer_scale": False, "prefix": 8,
                     "model_norm": False, "mean": CLIP_MEAN, "std": CLIP_STD},
    # hubconf.radio_model: '_feature_normalizer.' (mean [D], tx [D, D]) and
    # '_intermediate_feature_normalizer.' (alphas [L], rotation, means [L, D]) in the state dict.
    "radio_v2.5-h-norm": {"model": "vit_huge_patch16_224", "layer_scale": False, "prefix": 8,
                          "model_norm": False, "mean": CLIP_MEAN, "std": CLIP_STD,
                          "feature_normalizer": True},
    "radio_v2.5-g": {"model": "vit_giant_patch16_224", "layer_scale": False, "prefix": 8,
                     "model_norm": False, "mean": CLIP_MEAN, "std": CLIP_STD},
    "c-radio_v3-b": {"model": "vit_base_patch16_v2_224", "layer_scale": True, "prefix": 8,
                     "model_norm": False, "mean": CLIP_MEAN, "std": CLIP_STD},
    "c-radio_v3-l": {"model": "vit_large_patch16_v2_224", "layer_scale": True, "prefix": 8,
                     "model_norm": False, "mean": CLIP_MEAN, "std": CLIP_STD},
    "c-radio_v3-h": {"model": "vit_huge_patch16_224", "layer_scale": False, "prefix": 8,
                     "model_norm": False, "mean": CLIP_MEAN, "std": CLIP_STD},
    "c-radio_v3-g": {"model": "vit_giant_patch16_224", "layer_scale": False, "prefix": 8,
                     "model_norm": False, "mean": CLIP_MEAN, "std": CLIP_STD},
    "c-radio_v4-so400m": {"model": "vit_so400m_patch16_224", "layer_scale": False, "prefix": 10,
                          "model_norm": False, "mean": CLIP_MEAN, "std": CLIP_STD},
    "c-radio_v4-h": {"model": "vit_huge_patch16_224", "layer_scale": False, "prefix": 10,
                     "model_norm": False, "mean": CLIP_MEAN, "std": CLIP_STD},
}  # fmt: skip


def teachers(widths: dict[str, tuple[int | None, int]]) -> list[dict[str, Any]]:
    """``args.teachers``: one entry per teacher (``name``, ``type``, ``use_summary``), the first
    teacher listed a second time (NVlabs trains a teacher at two resolutions as two entries of
    one name; ``create_model_from_args`` counts tokens over ``set(t['name'] ...)``)."""
    entries = [
        # type: radio/adaptor_registry.py builds a GenericAdaptor for an unregistered type.
        {"name": name, "type": "generic", "use_summary": summary is not None, "input_size": 64}
        for name, (summary, _) in widths.items()
    ]  # fmt: skip
    return entries + [{**entries[0], "input_size": 128}]


def _mlp_v2(dim: int, hidden: int, out: int, generator: torch.Generator) -> dict[str, Tensor]:
    """NVlabs ``radio/adaptor_mlp.py`` ``MLP2`` with no inner blocks: ``fc1``, ``final.0`` (a
    LayerNorm), ``final.2``."""

    def rand(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=generator) * 0.3

    return {
        "fc1.weight": rand(hidden, dim), "fc1.bias": rand(hidden),
        "final.0.weight": 1 + rand(hidden), "final.0.bias": rand(hidden),
        "final.2.weight": rand(out, hidden), "final.2.bias": rand(out),
    }  # fmt: skip


def nvlabs_checkpoint(
    family: str, widths: dict[str, tuple[int | None, int]], seed: int = 0
) -> dict[str, Any]:
    """``{"args": Namespace, "state_dict": {...}}`` as ``torch.hub``'s ``radio_model`` reads it
    (hubconf: ``chk['args']``, ``chk['state_dict']``; keys ``base_model.*``,
    ``input_conditioner.norm_mean|norm_std``, ``_heads.<index>.*``,
    ``_feature_projections.<index>.*``). ``widths``: each teacher's (summary, feature) width."""
    spec = FAMILIES[family]
    generator = torch.Generator().manual_seed(seed)
    entries = teachers(widths)
    unique = list(dict.fromkeys(t["name"] for t in entries))
    registers = spec["prefix"] - len(unique)
    kwargs = {**TINY, **NVLABS_ONLY[spec["model"]]}
    vit = timm.create_model("vit_base_patch16_224", pretrained=False, num_classes=0, **kwargs)
    state: dict[str, Tensor] = {}
    for key, value in vit.state_dict().items():
        if key.startswith(("patch_embed.", "pos_embed", "cls_token")):
            continue  # replaced by the CPE patch generator (radio/enable_cpe_support.py)
        if key.startswith("norm.") and not spec["model_norm"]:
            continue  # create_model_from_args: model.norm = Identity without args.model_norm
        noise = torch.randn(value.shape, generator=generator)
        value = 1 + 0.3 * noise if key.endswith(("norm1.weight", "norm2.weight")) else 0.3 * noise
        if key.endswith((".ls1.gamma", ".ls2.gamma")):
            value = 0.5 + torch.rand(value.shape, generator=generator)
            key = key.replace(".gamma", ".grandma")  # dinov2_arch.LayerScale's parameter
        state["base_model." + key] = value
    dim = TINY["embed_dim"]
    side = CPE_MAX // PATCH
    # radio/vit_patch_generator.py: a bias-free Linear embedder on (c, y, x) patches, a
    # [1, (cpe_max_size / patch)^2, D] position grid, cls_token.token [T + R, D].
    state["base_model.patch_generator.embedder.weight"] = 0.3 * torch.randn(
        dim, 3 * PATCH * PATCH, generator=generator
    )
    state["base_model.patch_generator.pos_embed"] = 0.3 * torch.randn(
        1, side * side, dim, generator=generator
    )
    state["base_model.patch_generator.cls_token.token"] = torch.randn(
        spec["prefix"], dim, generator=generator
    )
    # radio/input_conditioner.py: norm_mean, norm_std buffers [3, 1, 1].
    state["input_conditioner.norm_mean"] = torch.tensor(spec["mean"]).reshape(3, 1, 1)
    state["input_conditioner.norm_std"] = torch.tensor(spec["std"]).reshape(3, 1, 1)
    if spec.get("feature_normalizer"):
        # radio/feature_normalizer.py: FeatureNormalizer (mean [D], tx [D, D]) and
        # IntermediateFeatureNormalizer (alphas [L], rotation [D, D], means [L, D]).
        state["_feature_normalizer.mean"] = torch.randn(dim, generator=generator)
        state["_feature_normalizer.tx"] = torch.randn(dim, dim, generator=generator) / dim**0.5
        layers = TINY["depth"]
        state["_intermediate_feature_normalizer.alphas"] = torch.rand(layers, generator=generator)
        state["_intermediate_feature_normalizer.rotation"] = torch.linalg.qr(
            torch.randn(dim, dim, generator=generator)
        )[0]
        state["_intermediate_feature_normalizer.means"] = torch.randn(
            layers, dim, generator=generator
        )
    for index, name in enumerate(unique):  # hubconf reads _heads.<tidx> or _heads.<name>
        summary, features = widths[name]
        # radio/adaptor_generic.py builds a summary MLP for every adaptor, use_summary or not.
        for k, v in _mlp_v2(dim, 2 * dim, summary or features, generator).items():
            state[f"_heads.{index}.{k}"] = v
        for k, v in _mlp_v2(dim, 2 * dim, features, generator).items():
            state[f"_feature_projections.{index}.{k}"] = v
    args = Namespace(
        # Every field create_model_from_args and hubconf.radio_model read.
        model=spec["model"], model_kwargs=dict(TINY), pretrained=False, in_chans=None,
        input_size=[3, 224, 224], num_classes=0, drop=0.0, drop_path=None, drop_block=None,
        gp=None, bn_momentum=None, bn_eps=None, torchscript=False, initial_checkpoint="",
        model_norm=spec["model_norm"], cpe_max_size=CPE_MAX, teachers=entries,
        cls_token_per_teacher=True, register_multiple=None, cpe_num_registers=registers,
        spectral_reparam=False, mlp_version="v2", spatial_mlp_version="v2", dtype=torch.float32,
    )  # fmt: skip
    return {"args": args, "state_dict": state}


def save_pth(checkpoint: dict[str, Any], path: Path) -> Path:
    """The ``.pth.tar`` torch.hub downloads (``torch.save`` of the dict)."""
    torch.save(checkpoint, path)
    return path


def save_hf_folder(checkpoint: dict[str, Any], folder: Path) -> Path:
    """NVlabs' Hugging Face folder (``radio/hf_model.py``: ``RADIOModel`` with
    ``radio_model = RADIOModel(...)``, ``config.args`` the training args): ``radio_model.model.*``
    (the trunk, ``base_model.`` renamed), ``radio_model.input_conditioner.*``,
    ``radio_model.adaptors.<name>.head_mlp|feat_mlp.*``, ``radio_model.feature_normalizer.*``,
    ``radio_model.inter_feature_normalizer.*`` (``RADIOModel``'s attribute names)."""
    from safetensors.torch import save_file

    args = checkpoint["args"]
    names = list(dict.fromkeys(t["name"] for t in args.teachers))
    weights = {}
    for key, value in checkpoint["state_dict"].items():
        if key.startswith("base_model."):
            key = "radio_model.model." + key[len("base_model.") :]
        elif key.startswith("input_conditioner."):
            key = "radio_model." + key
        elif key.startswith("_feature_normalizer."):
            key = "radio_model.feature_normalizer." + key.split(".", 1)[1]
        elif key.startswith("_intermediate_feature_normalizer."):
            key = "radio_model.inter_feature_normalizer." + key.split(".", 1)[1]
        else:
            group, index, rest = key.split(".", 2)
            mlp = "head_mlp" if group == "_heads" else "feat_mlp"
            key = f"radio_model.adaptors.{names[int(index)]}.{mlp}.{rest}"
        weights[key] = value.contiguous()
    folder.mkdir(parents=True, exist_ok=True)
    save_file(weights, str(folder / "model.safetensors"))
    plain = {k: v for k, v in vars(args).items() if k != "dtype"}
    config = {"architectures": ["RADIOModel"], "args": plain, "version": "radio_v2.5"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder
