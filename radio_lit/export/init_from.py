"""``model.init_from``: a stage's student and heads from an earlier stage or a published model.

The source's format is recognised from the file or folder and named in the log: a radio-lit
``.ckpt`` (:func:`radio_lit.export.checkpoint.student_weights`: student, heads and EMA), or a
published RADIO model in any layout :mod:`radio_lit.export.published` reads (NVlabs'
checkpoint, a Hugging Face folder, transformers' ``RadioModel``, timm's ``*_radio_v4``).

From a published model everything it holds comes across into the CPE ViT student through the
one key map of :mod:`radio_lit.export.layout`: the trunk (σReparam weights realized, then
reparametrized by the student as the same function), the CPE grid, the summary tokens and
registers, the input conditioner's mean and std (the student's ``student_mean``/``std``), and
each shipped adaptor head onto the run's teacher of the same name, or of the name that
``model.init_from.heads`` maps it to (``{teacher: shipped head}``); teachers with no shipped
head start fresh, listed in one log line. An imported feature head predicts in its teacher's
space until the run's statistics are estimated, and is then composed with its normalizer
(:class:`~radio_lit.export.head_spaces.ImportedHeads`). The student's architecture must be the
source's: another is refused in one line naming both. The student so built computes the
source's function in eval mode (to float rounding); a training forward draws random CPE
windows (:mod:`radio_lit.students.cpe_vit`), so its first outputs are near the source's, not
equal.

Usage::

    model:
      init_from: C-RADIOv4-H.pth.tar            # or a folder, or a radio-lit .ckpt
      # init_from: {path: c-radio.pth, heads: {siglip: siglip2-g}}
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn

from radio_lit.export.checkpoint import is_sharded_checkpoint, student_weights, training_state
from radio_lit.export.layout import (
    BASE,
    CONDITIONER,
    EMBEDDER,
    NORMALIZERS,
    POS_EMBED,
    PREFIX_TOKENS,
    heads_from_radio,
    trunk_from_radio,
)
from radio_lit.export.published import KNOWN, Published, read_published
from radio_lit.students import CPEViT, MLPHead, TeacherHeads
from radio_lit.students.ema import EMAStudent
from radio_lit.students.heads import mlp_shape

Source = str | Mapping[str, Any]


def initialize(module: Any, source: Source) -> None:
    """Load ``source`` (``model.init_from``: a path, or ``{path:, heads:}``) into ``module``
    (a :class:`~radio_lit.module.DistillationModule`)."""
    path, names = _source(source)
    if path.suffix == ".ckpt" or is_sharded_checkpoint(path):
        load_stage(module, path)
        return
    if not path.exists():
        raise FileNotFoundError(f"model.init_from: {path} does not exist; {KNOWN}")
    published = read_published(path)
    rank_zero_info(f"model.init_from: {path} ({published.format})")
    load_published(module, published, names)


def load_stage(module: Any, path: Path) -> None:
    """An earlier stage's ``.ckpt`` (or sharded folder) into ``module``: its student, heads
    and EMA (:func:`~radio_lit.export.checkpoint.student_weights`), and what it kept of a
    published start: the pixel conditioner (:mod:`radio_lit.students.conditioner`) and the
    imported heads, in the shapes the source shipped them and the space they predict in
    (:class:`~radio_lit.export.head_spaces.ImportedHeads`, carried heads included)."""
    state = training_state(path)
    _adopt_saved_heads(module, state)
    weights, _ = student_weights(path, module.state_dict(), module.heads, state)
    kept = ("conditioner.", "imported_heads.")
    weights.update({k: v for k, v in state.items() if k.startswith(kept)})
    module.load_state_dict(weights, strict=False)
    rank_zero_info(f"model.init_from: {path} (radio-lit checkpoint)")


def _adopt_saved_heads(module: Any, state: Mapping[str, Tensor]) -> None:
    """Each head that ``state`` holds in another shape than the config builds (a published
    model's head imported by an earlier stage: its own hidden width and depth) is rebuilt in
    the saved shape, and the EMA with it; a head of other input or output widths is left for
    :func:`~radio_lit.export.checkpoint.student_weights` to refuse."""
    rebuilt = False
    for name, own in list(module.heads.items()):
        prefix = f"heads.{name}."
        saved = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
        if not saved or "features.inp.weight" not in saved:
            continue
        shapes = {k: v.shape for k, v in own.state_dict().items()}
        if shapes == {k: v.shape for k, v in saved.items()}:
            continue
        heads = TeacherHeads.from_state(saved)
        if _widths(heads) != _widths(own):
            continue
        module.heads[name] = heads.to(dtype=own.features.out.weight.dtype)
        rebuilt = True
    if rebuilt and getattr(module, "ema", None) is not None:
        module.ema = EMAStudent(module.student, module.heads, module.ema.decay)


def _widths(heads: TeacherHeads) -> list[tuple[int, int] | None]:
    """The input and output widths of a teacher's feature and summary heads."""
    parts = (heads.features, heads.summary)
    return [None if h is None else (h.inp.in_features, h.out.out_features) for h in parts]


def _source(source: Source) -> tuple[Path, dict[str, str]]:
    if isinstance(source, Mapping):
        if "path" not in source or set(source) - {"path", "heads"}:
            raise ValueError(
                f"model.init_from: {dict(source)} is not {{path: FILE, heads: {{teacher: "
                "shipped head}}}}; give the file or folder, and optionally the name map"
            )
        return Path(str(source["path"])).expanduser(), dict(source.get("heads") or {})
    return Path(str(source)).expanduser(), {}


def load_published(module: Any, published: Published, names: Mapping[str, str]) -> None:
    """The published model's trunk, input normalization and heads into ``module``."""
    student = module.student
    if not isinstance(student, CPEViT):
        raise ValueError(
            f"model.init_from: {published.path} holds a ViT, and the config's student is a "
            f"{type(student).__name__}: use radio_lit.students.CPEViT"
        )
    num_cls = published.num_cls_tokens or student.num_cls_tokens
    check_architecture(published, student, num_cls)
    load_trunk(student, published, num_cls)
    _input_normalization(module, published.state)
    imported, fresh = load_heads(module, published, names)
    backbones = own_backbone(module, published.path)
    for name in backbones:
        module.imported_heads.own_backbone(name)
    if backbones:
        rank_zero_info(
            f"model.init_from: {backbones}: the model's own backbone output, which its exports "
            "are (no head of theirs is exported)"
        )
    if getattr(module, "ema", None) is not None:  # the EMA starts at the imported weights
        module.ema = EMAStudent(module.student, module.heads, module.ema.decay)
    rank_zero_info(f"model.init_from: heads imported {imported}; heads that start fresh: {fresh}")


def own_backbone(module: Any, path: Path) -> list[str]:
    """The run's teachers that are the published model's own backbone output (adapt, extend:
    a frozen copy of the model the student starts as), which an export leaves out: the student
    *is* that backbone (:class:`~radio_lit.export.head_spaces.ImportedHeads`)."""
    source = path.expanduser().resolve()
    mine = []
    for name, teacher in module.teachers.items():
        model = getattr(teacher, "backbone_of", None)
        if model is not None and Path(model).expanduser().resolve() == source:
            mine.append(name)
    return mine


def source_trunk(published: Published, num_cls: int) -> dict[str, Any]:
    """The trunk the source holds, read from its shapes (and its named head count)."""
    state = published.state
    weight = state[EMBEDDER]
    blocks = {k[len(BASE) :].split(".")[1] for k in state if k.startswith(BASE + "blocks.")}
    prefix = state[PREFIX_TOKENS].shape[0]
    trunk = {
        "width": int(weight.shape[0]),
        "patch": int(round((weight.shape[1] / 3) ** 0.5)),
        "depth": len(blocks),
        "grid": int(round(state[POS_EMBED].shape[1] ** 0.5)),
        "summary tokens": num_cls,
        "registers": prefix - num_cls,
        "final norm": any(k.startswith(BASE + "norm.") for k in state),
    }
    if published.architecture.get("num_heads"):
        trunk["heads"] = int(published.architecture["num_heads"])
    return trunk


def student_trunk(student: CPEViT) -> dict[str, Any]:
    """:func:`source_trunk`'s description of the config's student."""
    return {
        "width": student.embed_dim,
        "patch": student.patch_size,
        "depth": len(student.blocks),
        "grid": student.grid_side,
        "summary tokens": student.num_cls_tokens,
        "registers": student.num_registers,
        "final norm": not isinstance(student.norm, nn.Identity),
        "heads": int(student.blocks[0].attn.num_heads),
    }


def check_architecture(published: Published, student: CPEViT, num_cls: int) -> None:
    """Refuse a student of another architecture than the source's, naming both."""
    source, own = source_trunk(published, num_cls), student_trunk(student)
    extras = (published.args or {}).get("radio_lit") or {}
    window = extras.get("vitdet_window_size")  # the ViTDet layout a radio-lit export records
    if window is not None and (window, extras.get("vitdet_windowed")) != (
        student.vitdet_eval_window_size,
        list(student.windowed),
    ):
        raise ValueError(
            f"model.init_from: {published.path} attends within ViTDet windows of {window} "
            f"patches in blocks {extras.get('vitdet_windowed')}, the config's student in "
            f"{student.vitdet_eval_window_size} ({list(student.windowed)}): set "
            f"model.student.init_args.vitdet_eval_window_size: {window} (and its "
            "vitdet_num_windowed)"
        )
    corners = published.architecture.get("cpe_align_corners")
    if corners is not None and corners != student.cpe_align_corners:
        raise ValueError(
            f"model.init_from: {published.path} ({published.format}) resizes its CPE grid with "
            f"align_corners={corners}, the config's student with {student.cpe_align_corners}: "
            f"set model.student.init_args.cpe_align_corners: {str(corners).lower()} (or use "
            "radio_lit.export.PublishedStudent, which reads it)"
        )
    if extends_tokens(published, student, num_cls):
        own["summary tokens"] = source["summary tokens"]
    differ = {k: (v, own[k]) for k, v in source.items() if own[k] != v}
    if not differ:
        return
    named = published.architecture
    kwargs = dict(named.get("model_kwargs") or {})
    if "final norm" in differ:  # a source without a final LayerNorm (C-RADIOv4) or with one
        kwargs["final_norm"] = source["final norm"]
    names = [t["name"] for t in published.teachers]
    per_teacher = num_cls == len(names) > 1  # fit takes those as summary_tokens, by name
    hint = ", ".join(
        f"{k}: {v}"
        for k, v in (
            ("model", named.get("model")),
            ("model_kwargs", kwargs or None),
            ("max_resolution", source["grid"] * source["patch"]),
            (
                "summary_tokens" if per_teacher else "num_cls_tokens",
                names if per_teacher else num_cls,
            ),
            ("num_registers", source["registers"]),
        )
        if v is not None
    )
    raise ValueError(
        f"model.init_from: {published.path} ({published.format}) holds a ViT with "
        f"{_describe(source)}, but the config's student ({student.timm_model} "
        f"{student.timm_kwargs}) has {_describe(own)}; give the student the source's "
        f"architecture under model.student.init_args ({hint})"
    )


def extends_tokens(published: Published, student: CPEViT, num_cls: int) -> bool:
    """Whether ``student`` has the source's summary tokens and more, for teachers the source
    lacks: its ``summary_tokens`` name the source's teachers first, in their token order
    (NVlabs' token per teacher), then the new ones. ``[choice]``: a new token starts as a
    copy of the first summary token (the source's own summary)."""
    names = [t["name"] for t in published.teachers]
    declared = student.summary_tokens or []
    per_teacher = num_cls == len(names) > 1
    return per_teacher and len(declared) > num_cls and declared[:num_cls] == names


def _describe(trunk: Mapping[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in trunk.items())


def load_trunk(student: CPEViT, published: Published, num_cls: int) -> None:
    """The source's trunk into ``student`` (the layout's inverse map; LayerScale folded into
    the projection before it where the student has none: ``γ (W x + b) = (γ W) x + γ b``)."""
    patch_bias = student.patch_embed.proj.bias is not None
    weights = trunk_from_radio(published.state, num_cls, patch_bias)
    tokens, extra = weights["cls_token"], student.num_cls_tokens - num_cls
    if extra > 0:  # new teachers' tokens (extends_tokens): copies of the first
        weights["cls_token"] = torch.cat([tokens, tokens[:, :1].expand(1, extra, -1)], dim=1)
    own = student.state_dict()
    for key in [k for k in weights if k.endswith((".ls1.gamma", ".ls2.gamma")) and k not in own]:
        gamma = weights.pop(key).double()
        layer = key.replace(".ls1.gamma", ".attn.proj").replace(".ls2.gamma", ".mlp.fc2")
        for name in ("weight", "bias"):
            if f"{layer}.{name}" in weights:
                value = weights[f"{layer}.{name}"]
                scale = gamma[:, None] if name == "weight" else gamma
                weights[f"{layer}.{name}"] = (value.double() * scale).to(value.dtype)
    for ours, theirs in NORMALIZERS.items():  # a source's feature normalizers need the option
        has = any(k.startswith(ours) for k in weights)
        if has != any(k.startswith(ours) for k in own):
            option = (
                "feature_normalizer: true"
                if ours.startswith("feature")
                else ("intermediate_normalizers: <its layers>")
            )
            raise ValueError(
                f"model.init_from: {published.path} ({published.format}) "
                f"{'holds' if has else 'has no'} {theirs}* but the config's student "
                f"{'has none' if has else 'has one'}; "
                + (
                    f"set model.student.init_args.{option} (or use radio_lit.export."
                    "PublishedStudent, which reads it from the source)"
                    if has
                    else f"drop model.student.init_args.{option.split(':')[0]}"
                )
            )
    try:
        student.load_state_dict(weights, strict=True)
    except RuntimeError as error:
        first = str(error).splitlines()[1].strip() if "\n" in str(error) else str(error)
        raise ValueError(
            f"model.init_from: the trunk of {published.path} ({published.format}) does not fit "
            f"the config's student ({first[:200]}); give the student the source's blocks "
            "(timm model and model_kwargs)"
        ) from None


def _input_normalization(module: Any, state: Mapping[str, Tensor]) -> None:
    """The source's pixel mean and std (its input conditioner) as the student's."""
    if CONDITIONER + "norm_mean" not in state:
        return
    mean = tuple(float(v) for v in state[CONDITIONER + "norm_mean"].flatten())
    std = tuple(float(v) for v in state[CONDITIONER + "norm_std"].flatten())
    if (mean, std) != module.conditioner.values:
        rank_zero_info(
            f"model.init_from: the student's pixel mean/std are the source's: {mean} / {std}"
        )
    module.conditioner.set(mean, std)  # saved with the run, exported (students.conditioner)


def load_heads(
    module: Any, published: Published, names: Mapping[str, str]
) -> tuple[dict[str, str], list[str]]:
    """Each shipped head onto the run's teacher of its name (or ``names[teacher]``); returns
    ``{teacher: shipped head}`` imported and the teachers whose heads start fresh."""
    shipped = published.head_names()
    unknown = {t: n for t, n in names.items() if n not in shipped or t not in module.heads}
    if unknown:
        teacher, name = next(iter(unknown.items()))
        where = (
            f"no teacher {teacher!r} in this run (its teachers: {list(module.heads)})"
            if teacher not in module.heads
            else f"no head {name!r} among those {published.path} ships: {shipped}"
        )
        raise ValueError(
            f"model.init_from.heads maps {teacher!r} to {name!r}, but there is {where}; map "
            "each of the run's teachers to one of the shipped heads"
        )
    heads = heads_from_radio(published.state)
    slots = {t["name"]: int(t["token_slot"]) for t in published.teachers if t["use_summary"]}
    entries = {t["name"]: t for t in published.teachers}
    imported, fresh = {}, []
    for teacher, own in module.heads.items():
        name = names.get(teacher, teacher)
        if name not in shipped:
            fresh.append(teacher)
            continue
        state = {k[len(name) + 1 :]: v for k, v in heads.items() if k.startswith(name + ".")}
        width = own.features.out.out_features
        own.features = _head(published, name, "features", state, width)
        module.imported_heads.add(teacher, width, entries.get(name))
        imported[teacher] = name
        if own.summary is None:
            continue
        if name not in slots or "summary.inp.weight" not in state:
            fresh.append(f"{teacher} (summary)")
            continue
        if slots[name] != module.summary_token[teacher]:
            raise ValueError(
                f"model.init_from: {published.path}'s {name!r} summary reads token "
                f"{slots[name]}, this run's {teacher!r} token {module.summary_token[teacher]}; "
                "name the token of each teacher in the source's order with "
                f"model.student.init_args.summary_tokens: {[t['name'] for t in published.teachers]}"
            )
        own.summary = _head(published, name, "summary", state, own.summary.out.out_features)
    carried = [n for n in shipped if n not in imported.values() and n not in module.heads]
    for name in carried:  # kept, untrained, for the export (ImportedHeads.carry)
        state = {k[len(name) + 1 :]: v for k, v in heads.items() if k.startswith(name + ".")}
        module.imported_heads.carry(name, entries[name], state)
    if carried:
        rank_zero_info(f"model.init_from: shipped heads carried unchanged into exports: {carried}")
    return imported, fresh


def _head(published: Published, name: str, part: str, state: dict, width: int) -> MLPHead:
    """The shipped ``part`` head of ``name`` as a :class:`MLPHead` of its own depth, checked
    against the run teacher's ``width``."""
    prefix = part + "."
    own = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    shape = mlp_shape(own)
    if shape[2] != width:
        raise ValueError(
            f"model.init_from: {published.path} ships a {name!r} {part} head of width "
            f"{shape[2]}, but this run's teacher has {width} channels there; map the teacher "
            "to the shipped head of its own model (model.init_from.heads), or give it another "
            "name so that its head starts fresh"
        )
    head = MLPHead(*shape)
    missing, unexpected = head.load_state_dict(own, strict=False)
    if missing or unexpected:
        raise ValueError(
            f"model.init_from: {published.path}'s {name!r} {part} head is no MLP 'v2' of "
            f"radio-lit's kind (missing {missing[:3]}, unexpected {unexpected[:3]}); give the "
            "teacher another name so that its head starts fresh"
        )
    return head.to(dtype=torch.float32)
