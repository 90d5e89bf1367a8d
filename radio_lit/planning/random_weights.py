"""A config's teachers with random weights and fewer blocks: what ``radio-lit plan`` and the
benchmarks build when no weights can be (or need to be) loaded.

* :func:`random_init`, :func:`random_weight_overrides`: command-line overrides that give a
  teacher entry random weights (no pretrained tag, no checkpoint), and with a depth, that many
  blocks at the teacher's real widths;
* :func:`shorten_trunk`: an open_clip teacher's timm trunk cut to that depth once built.

(``benchmarks/harness.py`` builds its benchmarks with these.)
"""

from __future__ import annotations

import importlib
import inspect
import json
from collections.abc import Mapping
from typing import Any

__all__ = ["SAM_ENCODERS", "override", "random_init", "random_weight_overrides", "shorten_trunk"]

#: segment-anything's ``build_sam_vit_*`` encoders (what ``SAMTeacher(model_type)`` builds).
SAM_ENCODERS = {
    kind: dict(
        img_size=1024,
        patch_size=16,
        embed_dim=width,
        depth=depth,
        num_heads=16 if width > 768 else 12,
        mlp_ratio=4.0,
        out_chans=256,
        qkv_bias=True,
        use_rel_pos=True,
        window_size=14,
        global_attn_indexes=globals_,
    )
    for kind, width, depth, globals_ in (
        ("vit_b", 768, 12, [2, 5, 8, 11]),
        ("vit_l", 1024, 24, [5, 11, 17, 23]),
        ("vit_h", 1280, 32, [7, 15, 23, 31]),
    )
}


def override(key: str, value: Any) -> str:
    """``key=value`` for radio-lit's parser (a string as it is, anything else as JSON)."""
    return f"{key}={value if isinstance(value, str) else json.dumps(value)}"


def random_init(entry: Mapping[str, Any]) -> dict[str, Any]:
    """The ``init_args`` that give a teacher entry random weights, nothing to load: no
    pretrained weights (``false``, or ``null`` for a tag), no checkpoint, a model name without
    its pretrained tag (``vit_large_patch14_dinov2.lvd142m`` -> ``vit_large_patch14_dinov2``;
    a RADIO teacher's name is a version, kept)."""
    init = entry.get("init_args") or {}
    kind = entry["class_path"].rsplit(".", 1)[-1]
    default = getattr(_init_parameters(entry["class_path"]).get("pretrained"), "default", None)
    changes: dict[str, Any] = {}
    pretrained = init.get("pretrained", default)
    if pretrained not in (None, False, inspect.Parameter.empty):
        changes["pretrained"] = False if pretrained is True else None
    if init.get("checkpoint"):
        changes["checkpoint"] = None
    if isinstance(init.get("model"), str) and "." in init["model"] and kind != "RADIOTeacher":
        changes["model"] = init["model"].split(".")[0]
    return changes


def _init_parameters(class_path: str) -> Mapping[str, inspect.Parameter]:
    module, name = class_path.rsplit(".", 1)
    return inspect.signature(getattr(importlib.import_module(module), name)).parameters


def random_weight_overrides(
    name: str, entry: dict[str, Any], pretrained: bool, depth: int | None, at: str | None = None
) -> list[str]:
    """Overrides of teacher ``name`` (at config key ``at``, default ``--model.teachers.<name>``):
    random weights (:func:`random_init`) unless ``pretrained``; with ``depth``, that many blocks
    at the teacher's widths (open_clip's own towers, SAM, timm and transformers models;
    open_clip's timm trunks are shortened once built: :func:`shorten_trunk`). A wrapper's inner
    teacher (``UpsampledTeacher``, ``RescaledTeacher``...) alike, a wrapper's checkpoint left
    out (an untrained upsampler)."""
    key = f"{at or f'--model.teachers.{name}'}.init_args"
    init = entry.get("init_args") or {}
    if isinstance(init.get("teacher"), dict):
        inner = random_weight_overrides(name, init["teacher"], pretrained, depth, f"{key}.teacher")
        return inner + (
            [f"{key}.checkpoint=null"] if not pretrained and init.get("checkpoint") else []
        )
    kind = entry["class_path"].rsplit(".", 1)[-1]
    changes = {} if pretrained else random_init(entry)
    if kind == "SAM3Teacher" and not pretrained and not init.get("model_kwargs"):
        # transformers' own Sam3VisionConfig (SAM3's architecture) instead of the Hub's file
        changes = {"model": "sam3_vision_model", "pretrained": False}
        if depth is not None:
            backbone = {"model_type": "sam3_vit_model", "num_hidden_layers": depth}
            backbone["global_attn_indexes"] = [depth - 1]
            changes["model_kwargs"] = {"backbone_config": backbone}
    out = [override(f"{key}.{k}", v) for k, v in changes.items()]
    if depth is None or kind == "SAM3Teacher":
        return out
    if kind == "OpenCLIPTeacher":
        import open_clip

        cfg = init.get("model_cfg") or open_clip.get_model_config(init["model_name"])
        if "timm_model_name" in cfg["vision_cfg"]:  # a timm trunk: shorten_trunk, once built
            return out
        cfg = {**cfg, "vision_cfg": {**cfg["vision_cfg"], "layers": depth}}
        cfg["text_cfg"] = {**cfg["text_cfg"], "layers": min(depth, cfg["text_cfg"]["layers"])}
        out.append(override(f"{key}.model_cfg", cfg))
    elif kind == "SAMTeacher":
        kwargs = init.get("encoder_kwargs") or SAM_ENCODERS[init["model_type"]]
        kwargs = {**kwargs, "depth": depth, "global_attn_indexes": [depth - 1]}
        out += [f"{key}.model_type=null", override(f"{key}.encoder_kwargs", kwargs)]
    elif "model_kwargs" in _init_parameters(entry["class_path"]):
        kwargs = {**(init.get("model_kwargs") or {}), "depth": depth}
        out.append(override(f"{key}.model_kwargs", kwargs))
    else:
        print(f"note: teacher {name} ({kind}) kept at full depth")
    return out


def shorten_trunk(name: str, teacher: Any, depth: int) -> None:
    """Keep the first ``depth`` blocks of an open_clip teacher's timm trunk (SigLIP's: open_clip
    builds it at the timm model's own depth, which its config cannot set); widths kept."""
    trunk = getattr(getattr(teacher, "model", None), "trunk", None)
    blocks = getattr(trunk, "blocks", None)
    if blocks is not None and len(blocks) > depth:
        trunk.blocks = blocks[:depth]
        if isinstance(getattr(trunk, "feature_info", None), list):
            trunk.feature_info = trunk.feature_info[:depth]
        print(f"note: teacher {name} (open_clip timm trunk) shortened to {depth} blocks once built")
