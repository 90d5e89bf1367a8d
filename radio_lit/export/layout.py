"""The one key map between radio-lit's CPE ViT student with its heads and NVlabs/RADIO's
checkpoint layout, used by the writer (``radio-lit export``) and the reader
(``model.init_from``, :mod:`radio_lit.export.published`) alike.

Student side (``CPEViT`` state-dict keys, σReparam folded; ``D`` width, ``p`` patch, ``G``
CPE grid side, ``T`` summary tokens, ``R`` registers) and RADIO side:

============================================  ==============================================
``patch_embed.proj.weight [D, 3, p, p]``      ``base_model.patch_generator.embedder.weight
                                              [D, 3 p p]`` (the same (c, y, x) order)
``pos_embed [G G, D]`` + ``patch_embed.       ``base_model.patch_generator.pos_embed
proj.bias [D]``                               [1, G G, D]`` (RADIO's embedder has no bias:
                                              a constant added to every grid entry survives
                                              the bilinear resampling, whose weights sum to 1)
``cls_token [1, T, D]``, ``registers          ``base_model.patch_generator.cls_token.token
[1, R, D]``                                   [T + R, D]`` (summary tokens, then registers)
``blocks.*``, ``norm.*``                      ``base_model.blocks.*``, ``base_model.norm.*``
``feature_normalizer.mean|tx``               ``_feature_normalizer.mean|tx`` (NVlabs'
                                              ``FeatureNormalizer``, radio_v2.5-h-norm)
``intermediate_normalizer.alphas|rotation|    ``_intermediate_feature_normalizer.*``
means``
``blocks.<i>.ls<k>.gamma``                    ``base_model.blocks.<i>.ls<k>.grandma`` read
                                              as ``gamma`` (NVlabs' ``dinov2_arch.
                                              LayerScale``; its loader takes either name)
heads ``<t>.summary.<layer>``                 ``_heads.<t>.<layer'>``
heads ``<t>.features.<layer>``                ``_feature_projections.<t>.<layer'>``
============================================  ==============================================

with the adaptor MLP layers renamed by :data:`MLP_V2_NAMES` (RADIO's ``mlp_version`` v2,
``radio/adaptor_mlp.py`` ``MLP2``). Read back, the patch bias is zero (the bias is in the
grid), so writing what was read gives the same tensors bit for bit.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

#: radio-lit's MLPHead layer names -> RADIO's adaptor MLP "v2" names (``adaptor_mlp.MLP2``).
MLP_V2_NAMES = {
    "inp.": "fc1.",
    "norm.": "final.0.",
    "out.": "final.2.",
    "pre.": "pre_norm.",
    "inner.": "blocks.",
}
#: RADIO's adaptor groups per radio-lit head: summary MLP, feature MLP.
HEAD_GROUPS = {"summary": "_heads", "features": "_feature_projections"}
ADAPTOR_PREFIXES = tuple(f"{group}." for group in HEAD_GROUPS.values())
BASE, CONDITIONER = "base_model.", "input_conditioner."
GENERATOR = BASE + "patch_generator."
EMBEDDER, POS_EMBED = GENERATOR + "embedder.weight", GENERATOR + "pos_embed"
PREFIX_TOKENS = GENERATOR + "cls_token.token"
_TRUNK = ("blocks.", "norm.")
#: The student's feature normalizers -> NVlabs' checkpoint names (``hubconf.radio_model``).
NORMALIZERS = {
    "feature_normalizer.": "_feature_normalizer.",
    "intermediate_normalizer.": "_intermediate_feature_normalizer.",
}
#: Parameters of a timm ViT that NVlabs' CPE leaves in place and never uses (``reg_token`` of
#: timm's ``vit_*_radio_v4``, whose registers the CPE's prefix tokens are).
TIMM_UNUSED = ("reg_token",)


def trunk_to_radio(student: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``base_model.*`` of a CPE ViT student's state dict (σReparam folded, no ``student.``
    prefix; its ``norm_pre`` and patch norm identities)."""
    weight = student["patch_embed.proj.weight"]
    pos, bias = student["pos_embed"][None], student.get("patch_embed.proj.bias")
    prefix = [student["cls_token"][0]]
    if "registers" in student:
        prefix.append(student["registers"][0])
    state = {
        EMBEDDER: weight.reshape(weight.shape[0], -1),
        POS_EMBED: pos + bias if bias is not None else pos,
        PREFIX_TOKENS: torch.cat(prefix),
    }
    state.update({BASE + k: v for k, v in student.items() if k.startswith(_TRUNK)})
    for ours, theirs in NORMALIZERS.items():
        state.update({theirs + k[len(ours) :]: v for k, v in student.items() if k.startswith(ours)})
    return state


def trunk_from_radio(
    state: Mapping[str, Tensor], num_cls_tokens: int, patch_bias: bool
) -> dict[str, Tensor]:
    """The CPE ViT student's state dict (plain linear layers) of ``base_model.*``: the inverse
    of :func:`trunk_to_radio`, with a zero patch bias when the student has one."""
    weight = state[EMBEDDER]
    dim, patch = weight.shape[0], math.isqrt(weight.shape[1] // 3)
    tokens = state[PREFIX_TOKENS]
    student = {
        "patch_embed.proj.weight": weight.reshape(dim, 3, patch, patch),
        "pos_embed": state[POS_EMBED].reshape(-1, dim),
        "cls_token": tokens[None, :num_cls_tokens],
    }
    if patch_bias:
        student["patch_embed.proj.bias"] = weight.new_zeros(dim)
    if tokens.shape[0] > num_cls_tokens:
        student["registers"] = tokens[None, num_cls_tokens:]
    trunk = tuple(BASE + part for part in _TRUNK)
    student.update({_timm_name(k[len(BASE) :]): v for k, v in state.items() if k.startswith(trunk)})
    for ours, theirs in NORMALIZERS.items():
        kept = {k: v for k, v in state.items() if k.startswith(theirs)}
        student.update({ours + k[len(theirs) :]: v for k, v in kept.items()})
    return student


def _timm_name(key: str) -> str:
    """timm's name of a trunk key: NVlabs saves LayerScale's ``gamma`` as ``grandma``
    (``radio/dinov2_arch.py`` ``LayerScale``; its loader reads either name)."""
    return (
        key[: -len("grandma")] + "gamma" if key.endswith((".ls1.grandma", ".ls2.grandma")) else key
    )


def heads_to_radio(heads: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """``_heads.*`` / ``_feature_projections.*`` of heads state ``<t>.summary|features.*``."""
    state = {}
    for key, value in heads.items():
        teacher, part, rest = key.split(".", 2)
        state[f"{HEAD_GROUPS[part]}.{teacher}.{_rename(rest, MLP_V2_NAMES)}"] = value
    return state


def heads_from_radio(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The inverse of :func:`heads_to_radio` (other keys of ``state`` are left out)."""
    parts = {group: part for part, group in HEAD_GROUPS.items()}
    inverse = {new: old for old, new in MLP_V2_NAMES.items()}
    heads = {}
    for key, value in state.items():
        if key.startswith(ADAPTOR_PREFIXES):
            group, teacher, rest = key.split(".", 2)
            heads[f"{teacher}.{parts[group]}.{_rename(rest, inverse)}"] = value
    return heads


def to_radio_keys(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """An inference model's state dict (``_heads.<t>.inp.*``, ...) under RADIO's MLP names."""
    return {_rename_adaptor(k, MLP_V2_NAMES): v for k, v in state.items()}


def from_radio_keys(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Inverse of :func:`to_radio_keys` (the timm parameters the CPE trunk leaves unused,
    :data:`TIMM_UNUSED`, dropped)."""
    inverse = {new: old for old, new in MLP_V2_NAMES.items()}
    unused = {BASE + name for name in TIMM_UNUSED}
    return {_rename_adaptor(k, inverse): v for k, v in state.items() if k not in unused}


def _rename_adaptor(key: str, names: Mapping[str, str]) -> str:
    if not key.startswith(ADAPTOR_PREFIXES):
        return key
    group, teacher, rest = key.split(".", 2)
    return f"{group}.{teacher}.{_rename(rest, names)}"


def _rename(rest: str, names: Mapping[str, str]) -> str:
    for old, new in names.items():
        if rest.startswith(old):
            return new + rest[len(old) :]
    return rest
