"""``radio-lit export --format timm``: a student that timm's and transformers' C-RADIO classes load.

timm 1.0.31 ships NVlabs' C-RADIO backbones as ``vit_*_patch16_radio_v{3,4}`` (fixed
``img_size``) and ``naflexvit_*_patch16_radio_v{3,4}`` (any resolution), and reads NVlabs'
Hugging Face checkpoint layout (``radio_model.model.*``, ``_convert_radio``); transformers 5.x
has a native ``RadioModel`` that reads the same layout (its ``conversion_mapping``) with a
``config.json`` of ``model_type: radio``. This module writes one folder that both load:

- ``model.safetensors``: the backbone under NVlabs' names (``D`` width, ``p`` patch, ``G`` CPE
  grid side, ``T`` summary tokens, ``R`` registers):
  ``radio_model.model.patch_generator.embedder.weight [D, 3 p p]`` (bias-free; the student's
  patch bias is folded into the grid: a constant added to every grid entry survives bilinear
  resampling, whose weights sum to 1), ``…patch_generator.pos_embed [1, G G, D]``,
  ``…patch_generator.cls_token.token [T + R, D]`` (summary tokens first, then registers),
  ``radio_model.model.blocks.*`` (timm's names); ``radio_model.input_conditioner.norm_mean``,
  ``norm_std [3, 1, 1]``; ``radio_model.summary_idxs [S]`` (the summary teachers' token slots:
  RADIO's summary is their tokens concatenated). No adaptor heads: neither library has them.
- ``config.json``: transformers' ``RadioConfig`` fields, and under ``radio_lit`` the exact
  ``timm.create_model`` calls (name and constructor kwargs for the student's widths), the
  ``transformers`` call, the input each takes (:data:`INPUTS`: timm's classes normalized
  pixels, transformers' ``RadioModel`` pixels in [0, 1]), the teachers' summary slots and the
  training resolution.

The timm model is one of timm's C-RADIO classes with the fewest constructor overrides
(:data:`TIMM_CLASSES`); timm keeps the first prefix token as ``cls_token`` and the other
``T + R - 1`` as registers (``reg_tokens``). What they cannot represent is refused with the
fix (:func:`timm_incompatibilities`, :func:`timm_model`): a final norm (timm's C-RADIO
classes have none and drop ``norm.*`` silently), ViTDet windows at inference, a CPE resized
with ``align_corners=True`` (transformers resizes without), E-RADIO, and blocks that differ
from timm's (activation, norms, MLP). σReparam is folded by the export; LayerScale is folded
into the projection before it (``gamma * (W x + b) = (gamma W) x + gamma b``), which
transformers' ``RadioModel`` has no weights for. [choice]: the ``naflexvit_*`` class is the
one to use (exact at every resolution); the ``vit_*`` call is exact at its ``img_size``
only, the training resolution (timm resamples the CPE grid to it at load, RADIO's way).
"""

from __future__ import annotations

import copy
import functools
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import timm
import torch
from timm.data import OPENAI_CLIP_MEAN, OPENAI_CLIP_STD
from timm.layers import DropPath, LayerScale
from timm.models.vision_transformer import checkpoint_filter_fn
from torch import Tensor, nn

from radio_lit.export.files import CONFIG_NAME, WEIGHTS_NAME, save_umask_file
from radio_lit.export.model import RadioBackbone, RadioLitModel
from radio_lit.export.source import exported_model

#: timm's C-RADIO classes that resize the CPE grid as RADIO's format does
#: (``align_corners=False``) and have no LayerScale, in order of preference: C-RADIOv4-H
#: first. (C-RADIOv3-L has LayerScale, which timm's ``create_model`` cannot switch off:
#: it drops ``init_values=None``; C-RADIOv3-B/H resize with ``align_corners=True``.)
TIMM_CLASSES = (
    "vit_huge_patch16_radio_v4",
    "vit_so400m_patch16_radio_v4",
    "vit_giant_patch16_radio_v3",
)
#: NVlabs' Hugging Face prefixes: the timm trunk, and the model that holds it.
TRUNK_PREFIX, MODEL_PREFIX = "radio_model.model.", "radio_model."
#: The CPE grid side of timm's C-RADIO classes (2048 px at /16) and their input size.
TIMM_GRID, TIMM_IMG_SIZE = 128, 512
#: What each library's model takes as input (printed beside its call, recorded in
#: ``config.json``): timm's classes have no input normalization (``forward_features`` of
#: pixels already normalized with the ``pretrained_cfg``'s mean/std); transformers'
#: ``RadioModel`` holds NVlabs' input conditioner and normalizes pixels in [0, 1] itself.
INPUTS = {
    "timm": "input: normalized pixels, (x - mean) / std of timm.data.resolve_data_config({}, "
    "model=model), x in [0, 1]",
    "transformers": "input: pixels in [0, 1] (RadioModel normalizes them itself)",
}
#: Modules that are the identity in eval mode.
_EVAL_IDENTITY = (nn.Identity, nn.Dropout, DropPath)


@dataclass(frozen=True)
class TimmModel:
    """A timm C-RADIO class and its constructor overrides for one student.

    ``kwargs``: the student's architecture where it differs from the class (``embed_dim``,
    ``depth``, ``num_heads``, ``mlp_ratio``, ``reg_tokens``, ...); ``vit_kwargs`` adds
    ``img_size`` (the ``vit_*`` class is exact there only), ``naflex_kwargs`` the CPE grid
    size ``pos_embed_grid_size`` where it is not 128.
    """

    name: str
    kwargs: dict[str, Any]
    vit_kwargs: dict[str, Any]
    naflex_kwargs: dict[str, Any]

    @property
    def naflex_name(self) -> str:
        return "naflex" + self.name


def timm_incompatibilities(model: RadioLitModel) -> list[str]:
    """Why timm's C-RADIO classes (or transformers' ``RadioModel``) would not reproduce
    ``model``'s backbone, each with the option that fixes it (empty if they would)."""
    extras = model.config["radio_lit"]
    if extras.get("architecture") == "e-radio":
        return [
            "an E-RADIO student is no ViT, and timm's C-RADIO classes are ViTs: export it "
            "with --format safetensors or onnx"
        ]
    problems = []
    backbone = model.base_model
    if not isinstance(backbone.norm, nn.Identity):
        problems.append(
            "the student has a final norm (norm.*), which timm's C-RADIO classes do not have "
            "(final_norm=False) and drop on load, so the features would be wrong: train with "
            "model.student.init_args.model_kwargs.final_norm: false (C-RADIOv4-H has none), or "
            "export with --format safetensors"
        )
    if backbone.window_size is not None:
        problems.append(
            "the student attends within ViTDet windows at inference, which timm's C-RADIO "
            "classes do not: export with model.student.init_args.vitdet_eval_window_size: null"
        )
    if model.num_prefix == 1:
        problems.append(
            "the student has one prefix token and no registers, and timm's C-RADIO reader "
            "always gives its classes registers (the tokens after the first): train with "
            "model.student.init_args.num_registers: 1 or more (C-RADIOv4-H has 10 prefix "
            "tokens)"
        )
    if getattr(model, "_feature_normalizer", None) is not None:
        problems.append(
            "the model whitens its features with the published model's feature normalizer "
            "(_feature_normalizer.*, radio_v2.5-h-norm), which timm's C-RADIO classes do not "
            "have (timm's _convert_radio drops it), so the features would be wrong: export with "
            "--format radio, hf or safetensors"
        )
    if extras["cpe_align_corners"]:
        problems.append(
            "the student resizes its CPE grid with align_corners=True at inference, "
            "transformers' RadioModel and timm's C-RADIOv4 classes without: export with "
            "model.student.init_args.cpe_align_corners: false in the config given to --config "
            "(an inference-only setting: training's CPE windows do not read it)"
        )
    return problems


def fold_layer_scale(blocks: nn.Module) -> nn.Module:
    """A copy of ``blocks`` with every timm ``LayerScale`` (``ls1``, ``ls2``: ``x * gamma``)
    folded into the linear layer before it (``attn.proj``, ``mlp.fc2``) and replaced by
    ``nn.Identity``: the same function, without LayerScale weights (``blocks`` itself when
    it has none)."""
    if not any(isinstance(m, LayerScale) for m in blocks.modules()):
        return blocks
    blocks = copy.deepcopy(blocks)
    for block in blocks:
        for scale, parent in (("ls1", "attn"), ("ls2", "mlp")):
            layer = getattr(block, scale, None)
            if not isinstance(layer, LayerScale):
                continue
            owner = getattr(block, parent)
            linear = owner.proj if parent == "attn" else owner.fc2
            gamma = layer.gamma.detach()
            with torch.no_grad():
                linear.weight.mul_(gamma[:, None])
                if linear.bias is not None:
                    linear.bias.mul_(gamma)
            setattr(block, scale, nn.Identity())
    return blocks


def _architecture(patch: int, blocks: nn.Module, prefix: int, dim: int) -> dict[str, Any]:
    """The timm constructor arguments that describe a ViT's trunk (``reg_tokens``: the prefix
    tokens after timm's one class token)."""
    block = blocks[0]
    hidden = block.mlp.fc1.out_features
    ratio = hidden / dim
    if int(dim * ratio) != hidden:  # timm's Mlp takes int(dim * mlp_ratio)
        ratio = math.nextafter(ratio, math.inf)
    return {
        "patch_size": patch,
        "embed_dim": dim,
        "depth": len(blocks),
        "num_heads": int(block.attn.num_heads),
        "mlp_ratio": ratio,
        "qkv_bias": block.attn.qkv.bias is not None,
        "reg_tokens": prefix - 1,
    }


def _on_meta(name: str, **kwargs: Any) -> nn.Module:
    """timm model ``name`` built on the meta device (no memory, no weights)."""
    with torch.device("meta"):
        return timm.create_model(name, pretrained=False, weight_init="skip", **kwargs)


@functools.cache
def _class_architecture(name: str) -> dict[str, Any]:
    vit = _on_meta(name)
    return _architecture(
        vit.patch_embed.patch_size[0], vit.blocks, vit.num_prefix_tokens, vit.embed_dim
    )


def timm_model(backbone: RadioBackbone, resolution: tuple[int, int]) -> TimmModel:
    """The timm C-RADIO class with the fewest constructor overrides for ``backbone``'s widths
    (LayerScale folded); :func:`check_timm_reads` checks that it rebuilds the backbone.

    Args:
        backbone: the exported trunk (σReparam and LayerScale folded).
        resolution: the training resolution ``(H, W)``, the ``vit_*`` class's ``img_size``.
    """
    generator = backbone.patch_generator
    prefix = generator.cls_token.token.shape[0]
    try:
        wanted = _architecture(
            generator.patch_size, backbone.blocks, prefix, generator.embedder.out_features
        )
    except AttributeError as missing:  # another block type than timm's ViT Block
        raise ValueError(
            f"radio-lit export --format timm: the student's blocks are not timm's ViT blocks "
            f"({missing}), which timm's C-RADIO classes are made of: train on a plain timm ViT "
            "(e.g. vit_base_patch16_224 with model_kwargs), or export with --format safetensors"
        ) from None
    options = []
    for name in TIMM_CLASSES:
        defaults = _class_architecture(name)
        options.append((name, {k: v for k, v in wanted.items() if defaults[k] != v}))
    name, kwargs = min(options, key=lambda option: len(option[1]))  # first of the fewest
    height, width = resolution
    size = height if height == width else (height, width)
    vit_kwargs = {**kwargs, **({"img_size": size} if size != TIMM_IMG_SIZE else {})}
    grid = generator.grid_side
    naflex_grid = {"pos_embed_grid_size": (grid, grid)} if grid != TIMM_GRID else {}
    return TimmModel(name, kwargs, vit_kwargs, {**kwargs, **naflex_grid})


def _block_difference(ours: nn.Module, theirs: nn.Module) -> str | None:
    """The first module of ``ours`` that is not what ``theirs`` has in that place (type,
    ``extra_repr``, heads), eval-mode identities (dropout, drop path) being alike."""
    mine, other = dict(ours.named_modules()), dict(theirs.named_modules())
    for name in sorted(set(mine) | set(other)):
        a, b = mine.get(name), other.get(name)
        if _eval_identity(a) and _eval_identity(b):
            continue
        if a is None or b is None or type(a) is not type(b):
            return f"blocks.{name}: {type(a).__name__} here, {type(b).__name__} in timm"
        if a.extra_repr() != b.extra_repr():
            return f"blocks.{name}: {a.extra_repr()} here, {b.extra_repr()} in timm"
        for attribute in ("num_heads", "head_dim", "scale"):
            if getattr(a, attribute, None) != getattr(b, attribute, None):
                return f"blocks.{name}.{attribute}: {getattr(a, attribute)} here"
    return None


def check_timm_reads(blocks: nn.Module, state: dict[str, Tensor], chosen: TimmModel) -> None:
    """Refuse (``ValueError``, one line) an export that ``chosen``'s ``vit_*`` class would not
    rebuild: blocks that differ from timm's (:func:`_block_difference`), or keys and shapes
    of timm's checkpoint filter's output that are not exactly the model's (a strict load).
    Checked on the meta device, before anything is written."""
    vit = _on_meta(chosen.name, **chosen.vit_kwargs)
    difference = _block_difference(blocks, vit.blocks)
    if difference is not None:
        raise ValueError(
            f"radio-lit export --format timm: the student's blocks differ from timm's "
            f"{chosen.name} ({difference}), so timm's C-RADIO classes cannot rebuild them: "
            "train on a plain timm ViT (e.g. vit_huge_patch16_radio_v4, or vit_base_patch16_224 "
            "with model_kwargs), or export with --format safetensors"
        )
    converted = checkpoint_filter_fn(dict(state), vit, interpolation="bilinear", antialias=False)
    expected = {k: tuple(v.shape) for k, v in vit.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in converted.items()}
    if got != expected:
        missing = sorted(set(expected) - set(got))[:3]
        unexpected = sorted(set(got) - set(expected))[:3]
        shapes = sorted(k for k in set(got) & set(expected) if got[k] != expected[k])[:3]
        raise ValueError(
            f"radio-lit export --format timm: timm's {chosen.name} would not load this export "
            f"(missing {missing}, unexpected {unexpected}, other shapes {shapes}); export with "
            "--format safetensors"
        )


def _eval_identity(module: nn.Module | None) -> bool:
    return module is None or isinstance(module, _EVAL_IDENTITY)


def timm_state_dict(model: RadioLitModel, blocks: nn.Module) -> dict[str, Tensor]:
    """``model``'s backbone (with ``blocks`` in place of its own) and input normalization
    under NVlabs' Hugging Face names, plus ``radio_model.summary_idxs``."""
    backbone = model.base_model
    state = {
        TRUNK_PREFIX + "patch_generator." + k: v
        for k, v in backbone.patch_generator.state_dict().items()
    }
    state.update({TRUNK_PREFIX + "blocks." + k: v for k, v in blocks.state_dict().items()})
    for name, buffer in model.input_conditioner.state_dict().items():
        state[MODEL_PREFIX + "input_conditioner." + name] = buffer
    state[MODEL_PREFIX + "summary_idxs"] = torch.tensor(summary_idxs(model), dtype=torch.long)
    return {k: v.detach().contiguous() for k, v in state.items()}


def summary_idxs(model: RadioLitModel) -> list[int]:
    """The token slots of the teachers distilled with a summary, sorted (RADIO's
    ``summary_idxs``: its backbone summary concatenates those tokens)."""
    return sorted(set(model.summary_slots.values()))


def create_model_call(
    name: str, file: Path, overlay: dict[str, Any], kwargs: dict[str, Any]
) -> str:
    """The Python call ``timm.create_model(name, pretrained=True, pretrained_cfg_overlay=
    dict(file=..., **overlay), **kwargs)`` as text (values as ``repr``)."""
    entries = ", ".join(f"{k}={v!r}" for k, v in {"file": str(file), **overlay}.items())
    arguments = "".join(f", {k}={v!r}" for k, v in kwargs.items())
    return (
        f"timm.create_model({name!r}, pretrained=True, "
        f"pretrained_cfg_overlay=dict({entries}){arguments})"
    )


def transformers_config(model: RadioLitModel, blocks: nn.Module) -> dict[str, Any]:
    """transformers' ``RadioConfig`` fields of ``model``'s backbone (``model_type: radio``)."""
    generator = model.base_model.patch_generator
    dim = generator.embedder.out_features
    trunk = _architecture(generator.patch_size, blocks, model.num_prefix, dim)
    resolution = model.config["radio_lit"]["preferred_resolution"]
    return {
        "model_type": "radio",
        "architectures": ["RadioModel"],
        "hidden_size": dim,
        "num_hidden_layers": trunk["depth"],
        "num_attention_heads": trunk["num_heads"],
        "mlp_ratio": trunk["mlp_ratio"],  # transformers' MLP takes int(dim * mlp_ratio), as timm
        "hidden_act": "gelu",  # timm's nn.GELU (the blocks were checked against timm's)
        "layer_norm_eps": float(blocks[0].norm1.eps),
        "qkv_bias": trunk["qkv_bias"],
        "patch_size": generator.patch_size,
        "image_size": int(max(resolution)),
        "max_img_size": generator.grid_side * generator.patch_size,
        "num_cls_tokens": model.num_cls_tokens,
        "num_registers": model.num_prefix - model.num_cls_tokens,
        "summary_idxs": summary_idxs(model),
        "norm_mean": model.input_conditioner.norm_mean.flatten().tolist(),
        "norm_std": model.input_conditioner.norm_std.flatten().tolist(),
    }


def save_timm(model: RadioLitModel, folder: str | Path) -> tuple[list[Path], list[str]]:
    """Write ``model``'s backbone as the folder timm's and transformers' C-RADIO classes load.

    Returns:
        the files written (``model.safetensors``, ``config.json``) and the calls that load
        them (the ``naflexvit_*`` and ``vit_*`` ``timm.create_model`` calls, the
        transformers one), as recorded under ``config.json``'s ``radio_lit``.

    Raises:
        ValueError: one line, what cannot be represented and the option that fixes it.
    """
    problems = timm_incompatibilities(model)
    if problems:
        raise ValueError(
            "radio-lit export --format timm: this student cannot be loaded by timm's C-RADIO "
            "classes without changing its outputs: " + "; ".join(problems)
        )
    backbone = model.base_model
    blocks = fold_layer_scale(backbone.blocks)
    folded = RadioBackbone(backbone.patch_generator, blocks, backbone.norm)
    resolution = tuple(model.config["radio_lit"]["preferred_resolution"])
    chosen = timm_model(folded, resolution)
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    weights = folder / WEIGHTS_NAME
    state = timm_state_dict(model, blocks)
    check_timm_reads(blocks, state, chosen)
    save_umask_file(state, weights)
    overlay = _data_overlay(model, resolution)
    calls = {
        "naflexvit": create_model_call(
            chosen.naflex_name, weights.resolve(), overlay, chosen.naflex_kwargs
        ),
        "vit": create_model_call(chosen.name, weights.resolve(), overlay, chosen.vit_kwargs),
        "transformers": f"transformers.RadioModel.from_pretrained({str(folder.resolve())!r})",
    }
    config = transformers_config(model, blocks)
    config["radio_lit"] = {
        "format": "timm",
        "format_version": 1,
        "timm": {
            "model": chosen.naflex_name,
            "kwargs": chosen.naflex_kwargs,
            "fixed_size_model": chosen.name,
            "fixed_size_kwargs": chosen.vit_kwargs,
            "pretrained_cfg_overlay": overlay,
        },
        "calls": calls,
        "inputs": dict(INPUTS),
        "summary_slots": dict(model.summary_slots),
        "preferred_resolution": list(resolution),
        "teachers": [t["name"] for t in model.config["teachers"]],
    }
    if "source" in model.config["radio_lit"]:  # the checkpoint, step and weights exported
        config["radio_lit"]["source"] = model.config["radio_lit"]["source"]
    config_path = folder / CONFIG_NAME
    config_path.write_text(json.dumps(config, indent=2) + "\n")
    lines = [
        f"{calls['naflexvit']}  # any resolution; {INPUTS['timm']}",
        f"{calls['vit']}  # exact at {resolution[0]}x{resolution[1]} px only; {INPUTS['timm']}",
        f"{calls['transformers']}  # {INPUTS['transformers']}",
    ]
    return [weights, config_path], lines


def _data_overlay(model: RadioLitModel, resolution: tuple[int, int]) -> dict[str, Any]:
    """``pretrained_cfg`` entries where the student differs from timm's C-RADIO classes: its
    pixel mean/std and training resolution (what ``timm.data.resolve_data_config`` reads)."""
    mean = tuple(round(v, 6) for v in model.input_conditioner.norm_mean.flatten().tolist())
    std = tuple(round(v, 6) for v in model.input_conditioner.norm_std.flatten().tolist())
    overlay: dict[str, Any] = {}
    if not _close(mean, OPENAI_CLIP_MEAN) or not _close(std, OPENAI_CLIP_STD):
        overlay.update(mean=mean, std=std)
    if tuple(resolution) != (TIMM_IMG_SIZE, TIMM_IMG_SIZE):
        overlay["input_size"] = (3, *resolution)
    return overlay


def _close(a: tuple[float, ...], b: tuple[float, ...]) -> bool:
    return all(abs(x - y) < 1e-6 for x, y in zip(a, b, strict=True))


def export_timm(
    checkpoint: str | Path, folder: str | Path, config: str | Path | None = None, ema: bool = False
) -> tuple[list[Path], list[str]]:
    """:func:`save_timm` of a training checkpoint (its EMA weights with ``ema``)."""
    return save_timm(exported_model(checkpoint, config, ema), folder)
