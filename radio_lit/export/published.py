"""Reading a published RADIO model in any of its layouts into NVlabs' checkpoint layout.

``model.init_from`` (:mod:`radio_lit.export.init_from`) takes, besides a radio-lit ``.ckpt``:

- an NVlabs checkpoint (``.pth``, ``.pth.tar``, ``.pt``: torch.hub's or a Hugging Face
  download, or ``radio-lit export``'s): ``{"args": Namespace, "state_dict": {...}}``, with
  ``state_dict_ema`` preferred when present, as NVlabs' ``hubconf.radio_model`` does; its
  adaptor heads ``_heads.<name | index>`` and ``_feature_projections.<name | index>``;
  σReparam weights realized where the file holds them parametrized
  (``<layer>.parametrizations.weight.original`` and ``…weight.0[.parts.<c>]._u/_v/scale``,
  NVlabs' ``_SNReweight``: ``W · γ / (uᵀ W v + eps)``, after the power iteration that
  ``hubconf.radio_model`` runs when it realizes them on a module in training mode);
- a Hugging Face folder: NVlabs' (``config.json`` with ``args``, ``radio_model.model.*``,
  ``radio_model.input_conditioner.*``, ``radio_model.adaptors.<name>.head_mlp|feat_mlp.*``),
  transformers' native ``RadioModel`` (``model_type: radio``; its own names, or NVlabs' as
  ``radio-lit export --format timm`` writes them), or radio-lit's ``--format hf``;
- timm's ``vit_*_patch16_radio_v*`` weights (``cls_token``, ``reg_token``, ``pos_embed``,
  ``patch_embed.proj.*``, ``blocks.*``): a file, or a timm folder whose ``config.json``
  names the ``architecture``.

Each becomes a :class:`Published`: NVlabs' state-dict names (``base_model.*``,
``input_conditioner.*``, ``_heads.<name>.*``, ``_feature_projections.<name>.*``, the layout
:mod:`radio_lit.export.layout` maps onto the student), the teachers with their token slots,
the summary-token count and what the source says of the architecture. What is no RADIO model
of a known layout, or a truncated file, raises ``ValueError`` in one line naming the file,
what was found and what to pass.
"""

from __future__ import annotations

import json
import math
from argparse import Namespace
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import Tensor

from radio_lit.export.layout import (
    BASE,
    CONDITIONER,
    EMBEDDER,
    NORMALIZERS,
    POS_EMBED,
    PREFIX_TOKENS,
)

#: What to pass, said by every refusal.
KNOWN = (
    "pass a radio-lit .ckpt or export (.pth, .safetensors beside its .json), an NVlabs checkpoint "
    "(.pth/.pth.tar with args and state_dict), a "
    "Hugging Face folder (NVlabs' radio_model.* or transformers' RadioModel), or timm "
    "*_radio_v4 weights"
)
_KEPT = (BASE, CONDITIONER, "_heads.", "_feature_projections.", *NORMALIZERS.values())
_HF_WEIGHTS = ("model.safetensors", "pytorch_model.bin")


@dataclass
class Published:
    """A published RADIO model in NVlabs' checkpoint layout.

    Attributes:
        path: the file or folder it was read from.
        format: the layout recognised, as the log names it.
        state: ``base_model.*`` (a timm ViT with RADIO's patch generator), ``input_conditioner.
            norm_mean|norm_std [3, 1, 1]`` and the adaptor MLPs ``_heads.<name>.*``,
            ``_feature_projections.<name>.*`` (NVlabs' MLP v2 names), plain linear weights.
        teachers: ``args.teachers`` entries (``name``, ``use_summary``, ``token_slot``), in order;
            empty for a backbone without heads.
        num_cls_tokens: summary tokens at the front of ``cls_token.token``, or ``None`` where
            the source does not say (timm: one ``cls_token``, the rest ``reg_token``).
        architecture: what the source names (``model``, ``model_kwargs``, ``num_heads``).
        args: the source's training args (JSON values), carried into a later export.
    """

    path: Path
    format: str
    state: dict[str, Tensor]
    teachers: list[dict[str, Any]]
    num_cls_tokens: int | None
    architecture: dict[str, Any] = field(default_factory=dict)
    args: dict[str, Any] = field(default_factory=dict)

    def head_names(self) -> list[str]:
        """The teachers whose feature head the source ships."""
        return [t["name"] for t in self.teachers if f"_feature_projections.{t['name']}.fc1.weight"
                in self.state]  # fmt: skip


def refuse(path: Path, found: str) -> ValueError:
    """The one-line refusal of ``path``: what was found, and what to pass."""
    return ValueError(f"model.init_from: {path} is no RADIO model of a known layout ({found}); "
                      f"{KNOWN}")  # fmt: skip


def read_published(path: str | Path) -> Published:
    """The published model at ``path`` (a file or a folder), in NVlabs' layout."""
    path = Path(path).expanduser()
    if path.is_dir():
        return _read_folder(path)
    if path.suffix == ".safetensors":
        if path.with_suffix(".json").is_file():  # radio-lit's safetensors export
            config = _load_json(path.with_suffix(".json"))
            state = _load_safetensors(path)
            return _published(path, "radio-lit export (safetensors)", config, state)
        if (path.parent / "config.json").is_file():
            return _read_folder(path.parent)
        return _read_timm(path, _load_safetensors(path), None)
    checkpoint = _torch_load(path)
    if not isinstance(checkpoint, Mapping):
        raise refuse(path, f"a pickled {type(checkpoint).__name__}, not a dict")
    if "state_dict" in checkpoint and "args" in checkpoint:
        return _read_nvlabs(path, checkpoint)
    if any(str(k).startswith("patch_embed.") for k in checkpoint) and "reg_token" in checkpoint:
        return _read_timm(path, dict(checkpoint), None)
    raise refuse(path, f"a dict with keys {_first(checkpoint)}")


def _first(keys: Any, count: int = 4) -> str:
    keys = [str(k) for k in keys]
    return str(keys[:count])[:-1] + (", ...]" if len(keys) > count else "]")


def _torch_load(path: Path) -> Any:
    """``torch.load`` of tensors, plain values and ``argparse.Namespace`` only; a truncated or
    corrupt file is refused in one line."""
    try:
        with torch.serialization.safe_globals([Namespace]):
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # truncated, corrupt, not a torch file, or other pickled objects
        first = (str(error).strip().splitlines() or [type(error).__name__])[0].split(". ")[0]
        if "weights_only" in str(error) or "Unsupported global" in str(error):
            raise ValueError(
                f"model.init_from: {path} holds pickled objects other than tensors and "
                f"argparse.Namespace ({first[:160]}); load it yourself and save its 'args' (as a "
                "Namespace) and 'state_dict', or pass a safetensors Hugging Face folder"
            ) from error
        raise ValueError(
            f"model.init_from: {path} cannot be read ({first[:160]}): it is truncated or "
            f"corrupt (an interrupted download?), download it again; {KNOWN}"
        ) from error


def _load_safetensors(path: Path) -> dict[str, Tensor]:
    try:
        return load_file(str(path))
    except Exception as error:  # a truncated download raises from the header or the data
        first = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise ValueError(
            f"model.init_from: {path} cannot be read ({first[:160]}): it is truncated or "
            "corrupt (an interrupted download?), download it again"
        ) from error


def _load_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:  # a download cut short
        raise ValueError(
            f"model.init_from: {path} cannot be read ({error}): it is truncated or corrupt (an "
            "interrupted download?), download it again"
        ) from error


# -- NVlabs checkpoints -------------------------------------------------------------------------
def _read_nvlabs(path: Path, checkpoint: Mapping[str, Any]) -> Published:
    args = checkpoint["args"]
    args = dict(vars(args)) if isinstance(args, Namespace) else dict(args)
    ema = "state_dict_ema" in checkpoint
    state = dict(checkpoint["state_dict_ema" if ema else "state_dict"])
    state = {k[len("module.") :] if k.startswith("module.") else k: v for k, v in state.items()}
    if str(args.get("model", "")).startswith("eradio") and EMBEDDER not in state:
        raise ValueError(
            f"model.init_from: {path} is NVlabs' E-RADIO (args.model {args['model']!r}, "
            "radio/eradio_model.py's hybrid convolution and windowed-attention trunk), which "
            "radio-lit cannot import: its ERadio student follows AM-RADIO's paper, not that "
            "file's modules; train radio_lit.students.ERadio from scratch, or start from a ViT "
            "RADIO (RADIOv2.5, C-RADIOv3, C-RADIOv4)"
        )
    if EMBEDDER not in state:
        raise refuse(path, f"args and a state_dict without {EMBEDDER} (keys {_first(state)})")
    fmt = "radio-lit export (NVlabs layout)" if "radio_lit" in args else "NVlabs checkpoint"
    # hubconf.radio_model realizes a state_dict's σReparam weights (disable_spectral_reparam)
    # on a module still in training mode: each _SNReweight runs its power iteration once more
    # first. Its EMA branch turns σReparam off instead.
    option = None if ema else args.get("spectral_reparam")
    iterations = _spectral_iterations(option)
    return _published(path, fmt + (", state_dict_ema" if ema else ""), args, state, iterations)


def _published(
    path: Path, fmt: str, args: dict[str, Any], state: dict[str, Tensor], iterations: int = 0
) -> Published:
    """A :class:`Published` from NVlabs ``args`` and a state dict in NVlabs' names; σReparam
    realized after ``iterations`` power iterations (:func:`realize_spectral_reparam`)."""
    eps = _spectral_eps(args.get("spectral_reparam"))
    state = realize_spectral_reparam(state, eps, iterations)
    teachers = [dict(t) for t in args.get("teachers") or []]
    extras = args.get("radio_lit") or {}
    per_teacher = bool(args.get("cls_token_per_teacher"))
    # NVlabs counts one token per unique teacher name (radio_model.create_model_from_args).
    unique = len({t["name"] for t in teachers})
    num_cls = int(extras.get("num_cls_tokens", unique if per_teacher else 1))
    first: dict[str, dict[str, Any]] = {}
    for index, teacher in enumerate(teachers):
        teacher.setdefault("use_summary", True)
        teacher.setdefault("token_slot", index if per_teacher and num_cls > 1 else 0)
        for group in ("_heads", "_feature_projections"):  # heads saved by teacher index
            old, new = f"{group}.{index}.", f"{group}.{teacher['name']}."
            for key in [k for k in state if k.startswith(old)]:
                value = state.pop(key)
                if teacher["name"] not in first:  # a later entry of a name: NVlabs reads none
                    state[new + key[len(old) :]] = value
        first.setdefault(teacher["name"], teacher)
    # NVlabs' loader takes a name's first entry (hubconf.radio_model's adaptor lookup).
    teachers = list(first.values())
    for teacher in teachers:
        _refuse_other_heads(path, args, teacher, state)
    kept = {k: v for k, v in state.items() if k.startswith(_KEPT)}
    model, kwargs = timm_architecture(args.get("model"), args.get("model_kwargs") or {})
    architecture = {"model": model, "model_kwargs": kwargs}
    architecture["num_heads"] = _timm_heads(model, kwargs)
    return Published(path, fmt, kept, teachers, num_cls, architecture, _plain(args))


#: NVlabs/RADIO's own timm registrations (``radio/extra_timm_models.py``), which timm lacks:
#: the timm model each is, with the arguments that make it so (NVlabs' ``model_args``).
NVLABS_MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "vit_tiny_patch14_224": ("vit_tiny_patch16_224", {"patch_size": 14}),
    "vit_small_patch14_224": ("vit_small_patch16_224", {"patch_size": 14}),
    "vit_base_patch14_224": ("vit_base_patch16_224", {"patch_size": 14}),
    "vit_base_patch16_v2_224": ("vit_base_patch16_224", {
        "init_values": 1e-5, "reg_tokens": 4, "no_embed_class": True, "img_size": 518 * 16 // 14,
    }),
    "vit_large_patch16_v2_224": ("vit_large_patch16_224", {
        "init_values": 1e-5, "reg_tokens": 4, "no_embed_class": True, "img_size": 518 * 16 // 14,
    }),
    "vit_so400m_patch16_224": ("vit_base_patch16_224", {
        "embed_dim": 1152, "depth": 27, "num_heads": 16, "mlp_ratio": 4304 / 1152,
    }),
    "vit_so400m_v2_patch16_224": ("vit_base_patch16_224", {
        "embed_dim": 1152, "depth": 27, "num_heads": 16, "mlp_ratio": 4320 / 1152,
    }),
    "vit_huge_patch16_224": ("vit_huge_patch14_224", {"patch_size": 16}),
    "vit_giant_patch16_224": ("vit_base_patch16_224", {
        "embed_dim": 1536, "depth": 40, "num_heads": 24,
    }),
    "vit_bigG_patch14_224": ("vit_base_patch16_224", {
        "patch_size": 14, "embed_dim": 1664, "depth": 48, "num_heads": 16, "init_values": 1e-6,
    }),
}  # fmt: skip


def timm_architecture(model: Any, kwargs: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``(timm model, model_kwargs)`` of an ``args.model`` and its ``model_kwargs``: an NVlabs
    name (:data:`NVLABS_MODELS`) as the timm model it is, others as they are."""
    base, fixed = NVLABS_MODELS.get(model, (model, {}))
    return base, {**fixed, **kwargs}


def _refuse_other_heads(
    path: Path, args: Mapping[str, Any], teacher: Mapping[str, Any], state: Mapping[str, Tensor]
) -> None:
    """Refuse, in one line naming the head kind, an adaptor head radio-lit cannot import: MLP v1
    (``mlp_version``), ``attn`` or other non-v2 feature heads (``spatial_mlp_version``) or an
    upsampling feature head (``fd_upsample_factor``), each per teacher entry or from ``args``
    as NVlabs' ``radio/adaptor_generic.py`` ``GenericAdaptor`` reads them."""
    name = teacher["name"]
    summary = teacher.get("mlp_version", args.get("mlp_version") or "v2")
    feature = teacher.get("spatial_mlp_version", args.get("spatial_mlp_version") or summary)
    ups = teacher.get("fd_upsample_factor")
    kinds = []
    if summary != "v2" and any(k.startswith(f"_heads.{name}.") for k in state):
        kinds.append(f"an MLP {summary} summary head (mlp_version: {summary})")
    if any(k.startswith(f"_feature_projections.{name}.") for k in state):
        if feature != "v2":
            kinds.append(f"a {feature!r} feature head (spatial_mlp_version: {feature})")
        if ups not in (None, 1):
            kinds.append(f"an upsampling feature head (fd_upsample_factor: {ups})")
    if kinds:
        raise ValueError(
            f"model.init_from: {path} ships {' and '.join(kinds)} for teacher {name!r}, which "
            "radio-lit cannot import (it reads NVlabs' MLP v2 heads only); remove that teacher's "
            f"args.teachers entry and its _heads/_feature_projections keys from a copy of the file"
        )


def _plain(args: Mapping[str, Any]) -> dict[str, Any]:
    """``args`` with JSON values only (dtypes and other objects as strings)."""
    return json.loads(json.dumps(dict(args), default=str))


def _timm_heads(model: Any, kwargs: Mapping[str, Any]) -> int | None:
    """The attention heads of timm model ``model`` with ``kwargs`` (``None``: unknown to timm)."""
    import timm

    if not isinstance(model, str) or model not in timm.list_models():
        return None
    known = {k: v for k, v in kwargs.items()
             if k in ("depth", "embed_dim", "num_heads", "patch_size")}  # fmt: skip
    with torch.device("meta"):
        vit = timm.create_model(model, pretrained=False, weight_init="skip", **known)
    return int(vit.blocks[0].attn.num_heads) if hasattr(vit, "blocks") else None


def _spectral_eps(option: Any) -> float:
    """NVlabs' σReparam ``eps``: 1e-6 with ``spectral_reparam: true``, the dict's own (default
    1e-12) with a dict (``configure_spectral_reparam_from_args``)."""
    if isinstance(option, Mapping):
        return float(option.get("eps", 1e-12))
    return 1e-6


def _spectral_iterations(option: Any) -> int:
    """The power iterations NVlabs' ``_SNReweight`` runs per call in training mode: 1 with
    ``spectral_reparam: true``, the dict's ``n_power_iterations`` (default 1); none without."""
    if isinstance(option, Mapping):
        return int(option.get("n_power_iterations", 1))
    return 1 if option else 0


def realize_spectral_reparam(
    state: dict[str, Tensor], eps: float = 1e-6, iterations: int = 0
) -> dict[str, Tensor]:
    """``state`` with every parametrized weight (``<layer>.parametrizations.weight.original``
    and its ``_SNReweight`` state, one per row chunk under ``….weight.0.parts.<c>``) replaced by
    the weight it applies, ``<layer>.weight``: per chunk ``W γ / (uᵀ W v + eps)``, ``γ = scale``
    (version 1) or ``softplus(scale) + 0.05`` (version 2; NVlabs' ``_sn_version``), after
    ``iterations`` power iterations on ``u`` and ``v`` (torch's ``_SpectralNorm._power_method``:
    ``u = W v / |W v|``, ``v = Wᵀ u / |Wᵀ u|``; 0: as in eval mode), computed in float64; a
    missing chunk (``parts.<c>`` absent) is as it is."""
    marker = ".parametrizations.weight."
    layers = {k.split(marker)[0] for k in state if marker in k}
    if not layers:
        return state
    state = dict(state)
    for layer in sorted(layers):
        prefix = f"{layer}{marker}"
        original = state.pop(prefix + "original")
        keys = [k for k in state if k.startswith(prefix)]
        params = {k[len(prefix) :]: state.pop(k) for k in keys}
        chunked = any(k.startswith("0.parts.") for k in params)
        # NVlabs chunks the fused qkv in 3 and a SwiGLU w12 in 2 (``_ChunkedSNReweight``).
        count = (3 if layer.endswith("qkv") else 2) if chunked else 1
        chunks = list(original.double().chunk(count))
        for c, weight in enumerate(chunks):
            base = f"0.parts.{c}." if chunked else "0."
            if base + "_u" not in params:
                continue  # an identity chunk (NVlabs' values without renorm_values)
            u, v = params[base + "_u"].double(), params[base + "_v"].double()
            for _ in range(iterations):
                u = F.normalize(weight @ v, dim=0, eps=eps)
                v = F.normalize(weight.T @ u, dim=0, eps=eps)
            sigma = torch.dot(u, weight @ v) + eps
            scale = params[base + "scale"].double().reshape(-1)[:1]
            if int(params.get(base + "_sn_version", torch.tensor(1))) == 2:
                scale = F.softplus(scale) + 0.05
            chunks[c] = weight * (scale / sigma)
        state[f"{layer}.weight"] = torch.cat(chunks).to(original.dtype)
    return state


# -- Hugging Face and timm folders ----------------------------------------------------------------
def _read_folder(folder: Path) -> Published:
    config_path = folder / "config.json"
    if not config_path.is_file():
        inside = _first(sorted(p.name for p in folder.iterdir()))
        raise refuse(folder, f"a folder without config.json, holding {inside}")
    config = _load_json(config_path)
    if "radio" in config:  # radio-lit export --format hf
        from radio_lit.export.files import read_hf

        model = read_hf(folder)
        fmt = "radio-lit Hugging Face folder"
        return _published(folder, fmt, dict(model.config), model.radio_state_dict())
    weights = _folder_weights(folder)
    if "args" in config:  # NVlabs' RADIOModel (radio/hf_model.py)
        return _published(folder, "NVlabs Hugging Face folder", config["args"],
                          _from_nvlabs_hf(weights, config))  # fmt: skip
    if config.get("model_type") == "radio":  # transformers' native RadioModel
        return _read_transformers(folder, config, weights)
    if "architecture" in config and "embeds.proj.weight" in weights:  # timm's naflexvit_*
        return _read_timm(folder, _naflex_as_vit(folder, weights), config)
    if "architecture" in config:  # timm's pretrained folder
        return _read_timm(folder, weights, config)
    raise refuse(folder, f"a config.json with keys {_first(config)}")


def _folder_weights(folder: Path) -> dict[str, Tensor]:
    """The weights of a Hugging Face folder: ``model.safetensors`` (or its shards, listed by
    ``model.safetensors.index.json``), else ``pytorch_model.bin``."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        shards = sorted(set(_load_json(index)["weight_map"].values()))
        return {k: v for shard in shards for k, v in _load_safetensors(folder / shard).items()}
    if (folder / _HF_WEIGHTS[0]).is_file():
        return _load_safetensors(folder / _HF_WEIGHTS[0])
    if (folder / _HF_WEIGHTS[1]).is_file():
        return dict(_torch_load(folder / _HF_WEIGHTS[1]))
    raise refuse(folder, f"a config.json but none of {list(_HF_WEIGHTS)}")


def _from_nvlabs_hf(weights: Mapping[str, Tensor], config: Mapping[str, Any]) -> dict[str, Tensor]:
    """NVlabs' Hugging Face names -> its checkpoint names (``radio_model.model.`` ->
    ``base_model.``, ``radio_model.adaptors.<name>.head_mlp|feat_mlp.`` -> ``_heads.<name>.``,
    ``_feature_projections.<name>.``)."""
    state = {}
    for key, value in weights.items():
        key = key.removeprefix("radio_model.")
        if key.startswith("model."):  # transformers' LayerScale saved under NVlabs' names too
            for k in ("1", "2"):
                key = key.replace(f".layer_scale{k}.lambda1", f".ls{k}.gamma")
            state[BASE + key[len("model.") :]] = value
        elif key.startswith(CONDITIONER):
            state[key] = value
        elif key.startswith(("feature_normalizer.", "inter_feature_normalizer.")):
            # RADIOModel's attributes (radio/radio_model.py) -> hubconf's checkpoint names
            state["_" + key.replace("inter_feature", "intermediate_feature")] = value
        elif key.startswith("adaptors."):
            _, name, mlp, rest = key.split(".", 3)
            group = {"head_mlp": "_heads", "feat_mlp": "_feature_projections"}.get(mlp)
            if group is not None:
                state[f"{group}.{name}.{rest}"] = value
    return state


def _read_transformers(folder: Path, config: Mapping[str, Any], weights: dict) -> Published:
    """transformers' ``RadioModel``: its own names (``embeddings.*``, ``encoder.layer.<i>.*``,
    q/k/v projections apart, LayerScale ``lambda1``) or NVlabs' Hugging Face ones."""
    if any(k.startswith("radio_model.") for k in weights):
        state = _from_nvlabs_hf(weights, config)
    else:
        state = _from_transformers(weights)
    if config.get("use_swiglu_ffn"):
        raise refuse(folder, "a transformers RadioModel with SwiGLU MLPs, which a timm ViT "
                             "student does not have")  # fmt: skip
    num_cls = int(config.get("num_cls_tokens", 1))
    slots = list(config.get("summary_idxs") or [])
    teachers: list[dict[str, Any]] = []
    architecture = {"num_heads": config.get("num_attention_heads")}
    extras = {"summary_idxs": slots, "transformers": dict(config)}
    return Published(folder, "transformers RadioModel folder", state, teachers, num_cls,
                     architecture, _plain(extras))  # fmt: skip


def _from_transformers(weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """transformers' ``RadioModel`` names -> NVlabs' (the inverse of its conversion mapping:
    ``attention.q|k|v_proj`` concatenated into ``attn.qkv``, ``layer_scale<k>.lambda1`` to timm's
    ``ls<k>.gamma``)."""
    names = {
        "embeddings.patch_projection.weight": EMBEDDER,
        "embeddings.position_embedding": POS_EMBED,
        "embeddings.cls_register_token": PREFIX_TOKENS,
    }
    inner = {
        "attention.o_proj.": "attn.proj.",
        "layer_scale1.lambda1": "ls1.gamma",
        "layer_scale2.lambda1": "ls2.gamma",
    }
    state: dict[str, Tensor] = {}
    qkv: dict[str, dict[str, Tensor]] = {}
    for key, value in weights.items():
        if key in names:
            state[names[key]] = value
        elif key.startswith(CONDITIONER):
            state[key] = value
        elif key.startswith("encoder.layer."):
            index, rest = key[len("encoder.layer.") :].split(".", 1)
            if rest.startswith(("attention.q_proj.", "attention.k_proj.", "attention.v_proj.")):
                part, kind = rest[len("attention.") :].split(".", 1)
                qkv.setdefault(f"{BASE}blocks.{index}.attn.qkv.{kind}", {})[part[0]] = value
                continue
            for old, new in inner.items():
                if rest.startswith(old):
                    rest = new + rest[len(old) :]
            state[f"{BASE}blocks.{index}.{rest}"] = value
    for key, parts in qkv.items():
        state[key] = torch.cat([parts["q"], parts["k"], parts["v"]])
    return state


#: Arguments ``save_for_hf`` writes into a timm folder's ``model_args`` (its head, pooling,
#: input) that a RADIO trunk does not take: radio-lit's student sets its own.
_TIMM_HEAD_ARGS = frozenset({"num_classes", "global_pool", "dynamic_img_size"})


def _naflex_as_vit(folder: Path, weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """timm's ``naflexvit_*_radio_*`` weights under its ``vit_*`` names, as timm's own
    ``naflexvit.checkpoint_filter_fn`` maps them the other way: ``embeds.proj.weight
    [D, p p C]`` (a linear patch embedding, channels fastest) -> ``patch_embed.proj.weight
    [D, C, p, p]``; ``embeds.pos_embed [1, g, g, D]`` -> ``pos_embed [1, g g, D]``;
    ``embeds.cls_token``/``reg_token`` -> ``cls_token``/``reg_token``."""
    weight = weights["embeds.proj.weight"]
    patch = math.isqrt(weight.shape[1] // 3)
    if 3 * patch * patch != weight.shape[1]:
        raise refuse(folder, f"naflexvit weights whose embeds.proj.weight {list(weight.shape)} "
                             "is no linear embedding of square RGB patches")  # fmt: skip
    vit = {k: v for k, v in weights.items() if not k.startswith("embeds.")}
    vit["patch_embed.proj.weight"] = weight.reshape(-1, patch, patch, 3).permute(0, 3, 1, 2)
    if "embeds.proj.bias" in weights:
        vit["patch_embed.proj.bias"] = weights["embeds.proj.bias"]
    pos = weights["embeds.pos_embed"]
    vit["pos_embed"] = pos.reshape(1, -1, pos.shape[-1])
    for token in ("cls_token", "reg_token"):
        if f"embeds.{token}" in weights:
            vit[token] = weights[f"embeds.{token}"]
    return vit


def _naflex_architecture(name: str, kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The ``vit_*`` twin of timm's ``naflexvit_*`` model ``name`` (the same blocks) and how
    the naflexvit resizes its grid: ``align_corners`` as timm's own class sets it (C-RADIOv3-B
    and -H: ``True``, as released), aspect-preserving (a square, cropped: RADIO's CPE)."""
    import timm

    with torch.device("meta"):
        naflex = timm.create_model(name, pretrained=False, **kwargs)
    embeds = naflex.embeds
    if not embeds.pos_embed_ar_preserving or embeds.pos_embed_interp_mode != "bilinear":
        raise ValueError(f"timm {name}: a grid resized other than RADIO's CPE (a square, bilinear)")
    vit = {k: v for k, v in kwargs.items() if not k.startswith("pos_embed_")}
    twin = "vit_" + name.removeprefix("naflexvit_")
    return {"model": twin, "model_kwargs": vit, "num_heads": _timm_heads(twin, vit),
            "cpe_align_corners": bool(embeds.pos_embed_align_corners)}  # fmt: skip


def _read_timm(source: Path, weights: Mapping[str, Tensor], config: Mapping | None) -> Published:
    """timm's ``vit_*_radio_v*`` weights: ``cls_token [1, 1, D]`` then ``reg_token [1, R, D]``
    (RADIO's summary tokens and registers), ``pos_embed [1, g g, D]`` (the CPE grid timm
    resampled to its ``img_size``), ``patch_embed.proj`` (its bias goes into the grid)."""
    missing = [k for k in ("cls_token", "pos_embed", "patch_embed.proj.weight") if k not in weights]
    if missing:
        raise refuse(source, f"weights without {missing} (keys {_first(weights)})")
    weight, pos = weights["patch_embed.proj.weight"], weights["pos_embed"]
    bias = weights.get("patch_embed.proj.bias")
    tokens = [weights["cls_token"][0]]
    if "reg_token" in weights:
        tokens.append(weights["reg_token"][0])
    state = {
        EMBEDDER: weight.reshape(weight.shape[0], -1),
        POS_EMBED: pos + bias if bias is not None else pos,
        PREFIX_TOKENS: torch.cat(tokens),
    }
    state.update({BASE + k: v for k, v in weights.items() if k.startswith(("blocks.", "norm."))})
    architecture: dict[str, Any] = {}
    cfg = (config or {}).get("pretrained_cfg") or {}
    if config is not None:
        name = str(config["architecture"])
        args = config.get("model_args") or {}
        kwargs = {k: v for k, v in args.items() if k not in _TIMM_HEAD_ARGS}
        if name.startswith("naflexvit_"):
            architecture = _naflex_architecture(name, kwargs)
        else:
            architecture = {"model": name, "model_kwargs": kwargs,
                            "num_heads": _timm_heads(name, kwargs)}  # fmt: skip
    if "mean" in cfg and "std" in cfg:
        state[CONDITIONER + "norm_mean"] = torch.tensor(cfg["mean"]).view(3, 1, 1)
        state[CONDITIONER + "norm_std"] = torch.tensor(cfg["std"]).view(3, 1, 1)
    side = math.isqrt(pos.shape[1])
    if side * side != pos.shape[1]:
        raise refuse(source, f"timm weights whose pos_embed {list(pos.shape)} is no square grid "
                             "(a class-token position?)")  # fmt: skip
    return Published(source, "timm *_radio weights", state, [], None, architecture, {})


__all__ = ["KNOWN", "Published", "read_published", "realize_spectral_reparam"]
