"""NVlabs/RADIO's checkpoint format, read the way its loader reads it, written for the tests from
the format's definition (``hubconf.radio_model``, ``radio/radio_model.py``,
``radio/vit_patch_generator.py``, ``radio/cls_token.py``, ``radio/input_conditioner.py``,
``radio/adaptor_mlp.py``: ``MLP2``) and independent of radio_lit.export's own code.
"""

from __future__ import annotations

import math
from typing import Any

import timm
import torch
import torch.nn.functional as F
from torch import Tensor

#: Every ``args`` field the loader and ``create_model_from_args`` read.
ARGS_FIELDS = {
    "model", "model_kwargs", "pretrained", "in_chans", "input_size", "num_classes", "drop",
    "drop_path", "drop_block", "gp", "bn_momentum", "bn_eps", "torchscript",
    "initial_checkpoint", "model_norm", "cpe_max_size", "teachers", "cls_token_per_teacher",
    "register_multiple", "cpe_num_registers", "spectral_reparam", "mlp_version",
}  # fmt: skip
V2_KEYS = {"fc1.weight", "fc1.bias", "final.0.weight", "final.0.bias", "final.2.weight",
           "final.2.bias"}  # fmt: skip


def timm_vit(args: Any) -> Any:
    """The timm ViT ``create_model_from_args`` starts from."""
    from tests.export.nvlabs_files import NVLABS_ONLY

    kwargs = dict(args.model_kwargs)
    kwargs.pop("weight_init", None)
    model = args.model
    if model in NVLABS_ONLY:  # registered by NVlabs' radio/extra_timm_models.py, not by timm
        kwargs, model = {**NVLABS_ONLY[model], **kwargs}, "vit_base_patch16_224"
    return timm.create_model(model, pretrained=False, num_classes=args.num_classes, **kwargs)


def token_layout(args: Any) -> tuple[int, int]:
    """``(summary tokens, registers)`` of the loader's patch generator."""
    tokens = len({t["name"] for t in args.teachers}) if args.cls_token_per_teacher else 1
    return tokens, args.cpe_num_registers or 0


def expected_shapes(args: Any) -> dict[str, tuple[int, ...]]:
    """Every key the loader expects in ``state_dict``, with its shape (a full adaptor set)."""
    vit = timm_vit(args)
    dim, patch = vit.embed_dim, vit.patch_embed.patch_size[0]
    dropped = ("patch_embed.", "pos_embed", "cls_token", "head.")
    if not args.model_norm:
        dropped += ("norm.",)
    shapes = {
        f"base_model.{k}": tuple(v.shape)
        for k, v in vit.state_dict().items()
        if not k.startswith(dropped)
    }
    tokens, registers = token_layout(args)
    side = int(round(args.cpe_max_size / patch))
    shapes["base_model.patch_generator.embedder.weight"] = (dim, 3 * patch * patch)
    shapes["base_model.patch_generator.pos_embed"] = (1, side * side, dim)
    shapes["base_model.patch_generator.cls_token.token"] = (tokens + registers, dim)
    shapes["input_conditioner.norm_mean"] = shapes["input_conditioner.norm_std"] = (3, 1, 1)
    return shapes


def _mlp_v2(state: dict[str, Tensor], prefix: str, x: Tensor) -> Tensor:
    """``MLP2`` with no inner blocks: fc1 -> LayerNorm -> GELU -> Linear."""

    def p(name: str) -> Tensor:
        return state[prefix + name]

    x = F.linear(x, p("fc1.weight"), p("fc1.bias"))
    x = F.layer_norm(x, x.shape[-1:], p("final.0.weight"), p("final.0.bias"))
    return F.linear(F.gelu(x), p("final.2.weight"), p("final.2.bias"))


@torch.no_grad()
def reference_forward(
    checkpoint: dict[str, Any], images: Tensor
) -> dict[str, tuple[Tensor, Tensor]]:
    """``RADIOModel.forward`` in eval mode with every adaptor: ``{"backbone": (summary [B, S D],
    features [B, h w, D]), <teacher>: (summary, features [B, h w, C])}``."""
    args, state = checkpoint["args"], checkpoint["state_dict"]
    vit = timm_vit(args).eval()
    # dinov2_arch.LayerScale loads 'gamma' or 'grandma' (its _load_from_state_dict).
    base = {k[len("base_model.") :].replace(".grandma", ".gamma"): v for k, v in state.items()
            if k.startswith("base_model.")}  # fmt: skip
    vit.load_state_dict({k: v for k, v in base.items() if not k.startswith("patch_generator.")},
                        strict=False)  # fmt: skip
    patch = vit.patch_embed.patch_size[0]
    x = (images - state["input_conditioner.norm_mean"]) / state["input_conditioner.norm_std"]
    batch, _, height, width = x.shape
    h, w = height // patch, width // patch
    # Im2Patches: 'b c (py yy) (px xx) -> b (py px) (c yy xx)', then the bias-free embedder.
    patches = x.reshape(batch, 3, h, patch, w, patch).permute(0, 2, 4, 1, 3, 5)
    patches = patches.reshape(batch, h * w, 3 * patch * patch)
    tokens = patches @ base["patch_generator.embedder.weight"].T
    pos = base["patch_generator.pos_embed"]
    side = math.isqrt(pos.shape[1])
    if (h, w) != (side, side):
        grid = pos.reshape(1, side, side, -1).permute(0, 3, 1, 2)
        size = max(h, w)
        grid = F.interpolate(grid, size=(size, size), mode="bilinear", align_corners=False)
        pos = grid[:, :, :h, :w].flatten(2).permute(0, 2, 1)
    prefix = base["patch_generator.cls_token.token"]
    y = torch.cat([prefix.expand(batch, -1, -1), tokens + pos], dim=1)
    y = vit.norm(vit.blocks(y)) if args.model_norm else vit.blocks(y)

    tokens_, registers = token_layout(args)
    all_summary, features = y[:, :tokens_], y[:, tokens_ + registers :]
    if args.cls_token_per_teacher:
        first = {}
        for i, t in enumerate(args.teachers):
            if t.get("use_summary", True):
                first.setdefault(t["name"], i)
        summary_idxs = sorted(first.values())
    else:
        summary_idxs = [0]
    if "_feature_normalizer.mean" in state:  # RADIOModel._extract_final: features only
        mean, tx = state["_feature_normalizer.mean"], state["_feature_normalizer.tx"]
        features = (features - mean) @ tx.T
    outputs = {"backbone": (all_summary[:, summary_idxs].flatten(1), features)}
    for i, t in enumerate(args.teachers):
        name = t["name"]
        if name in outputs:  # hubconf's adaptor lookup stops at a name's first entry
            continue
        slot = t.get("token_slot", i) if args.cls_token_per_teacher else 0
        summary = all_summary[:, slot]
        # hubconf: an adaptor's state under _heads.<tidx> or _heads.<name>
        by = name if f"_feature_projections.{name}.fc1.weight" in state else i
        has_summary = t.get("use_summary", True) and f"_heads.{by}.fc1.weight" in state
        outputs[name] = (
            _mlp_v2(state, f"_heads.{by}.", summary) if has_summary else None,
            _mlp_v2(state, f"_feature_projections.{by}.", features),
        )
    return outputs
