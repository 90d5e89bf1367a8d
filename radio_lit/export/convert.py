"""From a trained student, its heads and normalizers to the exported model (RADIO layout).

The conversion is exact in eval mode. For a CPE ViT student: σReparam is folded into plain
linear weights, the patch-embedding bias into the position embedding (bilinear resampling of
the grid preserves a constant), the ``[G * G, D]`` CPE grid becomes RADIO's ``[1, G * G, D]``,
the summary tokens and registers become ``cls_token.token``, and each feature head absorbs its
normalizer's inverse (PHI-S A.6). An E-RADIO student is exported as it is (σReparam folded)
under ``base_model.model.*``, with its architecture in the config. What RADIO's format cannot
express is reported by :func:`radio_incompatibilities` with the student option that fixes it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from torch import nn

from radio_lit.export.fold import fold_normalizer
from radio_lit.export.head_spaces import ImportedHeads
from radio_lit.export.layout import GENERATOR, trunk_to_radio
from radio_lit.export.model import (
    ERadioBackbone,
    InputConditioner,
    PatchGenerator,
    RadioBackbone,
    RadioLitModel,
    zero_summary_head,
)
from radio_lit.normalizers import Normalizer
from radio_lit.students import CPEViT, ERadio, Student, TeacherHeads, fold_spectral_reparam
from radio_lit.students.heads import summary_token_slots

#: NVlabs/RADIO adaptor ``type`` per radio-lit teacher class (an unregistered type gets RADIO's
#: GenericAdaptor; ``open_clip`` also loads the CLIP text tower, see :func:`teacher_entry`).
TEACHER_TYPES = {
    "OpenCLIPTeacher": "open_clip",
    "DINOv2Teacher": "dino_v2",
    "SAMTeacher": "sam",
}

#: NVlabs/RADIO's ``siglip2`` adaptor ``model`` name (its ``radio/siglip2_adaptor.py``, which
#: loads the Hugging Face text tower) per checkpoint a ``TransformersTeacher`` loads; RADIO's
#: other SigLIP2 entry is the NaFlex so400m, not a fixed-grid teacher.
SIGLIP2_MODELS = {"google/siglip2-giant-opt-patch16-384": "siglip2-g-384"}


def teacher_entry(
    name: str,
    class_path: str,
    init_args: Mapping[str, Any],
    use_summary: bool,
    token_slot: int,
) -> dict[str, Any]:
    """One ``args.teachers`` entry: ``name``, ``type``, ``use_summary``, ``token_slot``.

    An open_clip teacher named by hub/file weights (``model_name`` + ``pretrained``, no
    ``model_cfg``) is typed ``open_clip`` with ``model`` and ``pretrained``, and a pretrained
    SigLIP2 loaded from Hugging Face (:data:`SIGLIP2_MODELS`) ``siglip2`` with ``model``, so
    that RADIO's loader attaches that model's text encoder (zero-shot); any other teacher gets
    a generic adaptor type (``clip`` for a custom open_clip model).
    """
    class_name = class_path.rsplit(".", 1)[-1]
    kind = TEACHER_TYPES.get(class_name, "generic")
    entry: dict[str, Any] = {"name": name, "type": kind}
    siglip2 = SIGLIP2_MODELS.get(str(init_args.get("model")))
    pretrained = init_args.get("pretrained", True) and not init_args.get("model_kwargs")
    if class_name == "TransformersTeacher" and siglip2 is not None and pretrained:
        entry.update(type="siglip2", model=siglip2)
    if kind == "open_clip":
        if init_args.get("pretrained") and not init_args.get("model_cfg"):
            entry["model"] = init_args["model_name"]
            entry["pretrained"] = init_args["pretrained"]
        else:
            entry["type"] = "clip"
    entry["use_summary"] = use_summary
    entry["token_slot"] = token_slot
    return entry


def radio_config(
    student: CPEViT, teachers: list[dict[str, Any]], resolution: tuple[int, int]
) -> dict[str, Any]:
    """The RADIO ``args`` fields (every one NVlabs/RADIO's ``hubconf.radio_model`` reads) and
    radio-lit's own under ``"radio_lit"``; JSON-serializable.

    Args:
        student: the trained student (its timm architecture, CPE grid and token layout).
        teachers: :func:`teacher_entry` dicts in the training module's teacher order.
        resolution: the student's training resolution ``(H, W)`` (recorded as preferred).
    """
    num_tokens = student.num_cls_tokens
    return {
        # radio.radio_model.create_model_from_args
        "model": student.timm_model,
        "model_kwargs": dict(student.timm_kwargs),
        "pretrained": False,
        "in_chans": None,
        "input_size": None,
        "num_classes": 0,
        "drop": 0.0,
        "drop_path": None,
        "drop_block": None,
        "gp": None,
        "bn_momentum": None,
        "bn_eps": None,
        "torchscript": False,
        "initial_checkpoint": None,
        "model_norm": True,
        "cpe_max_size": student.grid_side * student.patch_size,
        "cls_token_per_teacher": num_tokens > 1,
        "register_multiple": None,
        "cpe_num_registers": student.num_registers or None,
        "teachers": teachers,
        # hubconf.radio_model and radio.adaptor_generic.GenericAdaptor
        "spectral_reparam": False,
        "spectral_heads": False,
        "damp": None,
        "mlp_version": "v2",
        "spatial_mlp_version": "v2",
        "radio_lit": {
            "format_version": 1,
            "patch_size": student.patch_size,
            "num_cls_tokens": num_tokens,
            "num_registers": student.num_registers,
            "cpe_align_corners": student.cpe_align_corners,
            "timm_img_size": list(student.patch_embed.img_size),
            "timm_class_token": student.timm_class_token,
            "vitdet_window_size": student.vitdet_eval_window_size,
            "vitdet_windowed": list(student.windowed),
            "preferred_resolution": list(resolution),
        },
    }


def eradio_config(
    student: ERadio, teachers: list[dict[str, Any]], resolution: tuple[int, int]
) -> dict[str, Any]:
    """The exported config of an E-RADIO student: its architecture under ``radio_lit.eradio``
    (what :class:`~radio_lit.students.ERadio` is built from), JSON-serializable."""
    return {
        "model": "e-radio",
        "teachers": teachers,
        "radio_lit": {
            "format_version": 1,
            "architecture": "e-radio",
            "eradio": dict(student.arch),
            "patch_size": student.patch_size,
            "num_cls_tokens": student.num_cls_tokens,
            "num_registers": 0,
            "preferred_resolution": list(resolution),
        },
    }


def radio_incompatibilities(config: Mapping[str, Any]) -> list[str]:
    """Why NVlabs/RADIO's loader would not reproduce this model (empty if it would)."""
    extras = config["radio_lit"]
    teachers = config["teachers"]
    if extras.get("architecture") == "e-radio":
        return [
            "radio-lit's E-RADIO is written from the AM-RADIO paper and its weights are not laid "
            "out as NVlabs/RADIO's E-RADIO code expects: export it with --format safetensors "
            "(or onnx)"
        ]
    problems = []
    if extras["cpe_align_corners"]:
        problems.append(
            "the student resizes its CPE grid with align_corners=True in eval mode, RADIO with "
            "align_corners=False: train with model.student.init_args.cpe_align_corners: false"
        )
    if extras["num_cls_tokens"] not in (1, len(teachers)):
        problems.append(
            f"the student has {extras['num_cls_tokens']} summary tokens; RADIO has one shared "
            f"token or one per teacher ({len(teachers)}, SAM included): train with "
            f"model.student.init_args.summary_tokens: {[t['name'] for t in teachers]} "
            "(one token per teacher, num_cls_tokens left out)"
        )
    if not extras.get("timm_class_token", True):
        problems.append(
            f"the student's timm model {config['model']!r} has no class token, so RADIO's "
            f"loader would read its first {extras['num_cls_tokens']} patch tokens as the "
            "summary: train on a timm ViT with a class token (set "
            "model.student.init_args.model_kwargs.class_token: true, or use e.g. "
            "vit_base_patch16_224), or export with --format safetensors"
        )
    side = config["cpe_max_size"]
    if extras.get("timm_img_size") == [side, side]:
        problems.append(
            f"the CPE grid covers {side} px, the timm model's img_size, for which RADIO's loader "
            "turns CPE off: set model.student.init_args.max_resolution to another multiple of "
            "the patch size (2048 in the stage configs)"
        )
    if extras.get("vitdet_window_size") is not None:
        problems.append(
            "the student attends within ViTDet windows in eval mode, which RADIO's loader only "
            "does when asked (its vitdet_window_size argument): export with "
            "model.student.init_args.vitdet_eval_window_size: null"
        )
    digit_names = [t["name"] for t in teachers if t["name"][:1].isdigit()]
    if digit_names:
        problems.append(
            f"teacher names {digit_names} start with a digit, which RADIO's loader reads as "
            "teacher indices (_heads.<index>): rename them under model.teachers"
        )
    return problems


def inference_model(
    student: CPEViT | ERadio,
    heads: Mapping[str, TeacherHeads],
    normalizers: Mapping[str, Normalizer],
    teachers: list[dict[str, Any]],
    pixel_mean: tuple[float, ...],
    pixel_std: tuple[float, ...],
    resolution: tuple[int, int],
) -> RadioLitModel:
    """The exported model of a trained student (copies; the arguments are left unchanged).

    Args:
        student: the trained student.
        heads: per-teacher adaptor heads (normalized-space feature heads).
        normalizers: per-teacher fitted normalizers, folded into the feature heads.
        teachers: :func:`teacher_entry` dicts, in the order of ``heads``.
        pixel_mean: the student's input normalization mean (``[0, 1]`` images).
        pixel_std: its std.
        resolution: the student's training resolution ``(H, W)``.

    Returns:
        A :class:`RadioLitModel` in eval mode, on the student's device.
    """
    if isinstance(student, ERadio):
        eradio = fold_spectral_reparam(copy.deepcopy(student)).eval()
        config = eradio_config(eradio, teachers, resolution)
        backbone: nn.Module = ERadioBackbone(eradio)
    else:
        config, backbone = _vit_backbone(student, teachers, resolution)
    summary_heads, feature_heads = {}, {}
    for name, head in heads.items():
        summary_heads[name] = (
            copy.deepcopy(head.summary)
            if head.summary is not None
            else zero_summary_head(student.embed_dim)
        )
        feature_heads[name] = fold_normalizer(head.features, normalizers[name])
    model = RadioLitModel(
        config,
        backbone,
        InputConditioner(tuple(pixel_mean), tuple(pixel_std)),
        summary_heads,
        feature_heads,
        feature_normalizer=copy.deepcopy(getattr(student, "feature_normalizer", None)),
        intermediate_normalizer=copy.deepcopy(getattr(student, "intermediate_normalizer", None)),
    )
    return model.to(next(student.parameters()).device)


def _vit_backbone(
    student: CPEViT, teachers: list[dict[str, Any]], resolution: tuple[int, int]
) -> tuple[dict[str, Any], RadioBackbone]:
    """The RADIO config and trunk (``base_model``) of a CPE ViT student (σReparam folded)."""
    student = fold_spectral_reparam(copy.deepcopy(student)).eval()
    for part, module in [
        ("norm_pre", student.norm_pre),
        ("patch_embed.norm", student.patch_embed.norm),
    ]:
        if not isinstance(module, nn.Identity):
            raise ValueError(
                f"the student's timm model {student.timm_model!r} has a {part} layer, which the "
                "RADIO layout does not have; use a timm ViT without it (e.g. vit_base_patch16_224)"
            )
    config = radio_config(student, teachers, resolution)
    dim, patch = student.embed_dim, student.patch_size
    generator = PatchGenerator(
        patch,
        dim,
        student.grid_side,
        student.num_cls_tokens + student.num_registers,
        align_corners=student.cpe_align_corners,
    ).to(student.pos_embed.device)
    radio = trunk_to_radio(student.state_dict())  # the one key map (export.layout)
    generator.load_state_dict(
        {k[len(GENERATOR) :]: v.detach() for k, v in radio.items() if k.startswith(GENERATOR)}
    )
    backbone = RadioBackbone(
        generator,
        student.blocks,
        student.norm,
        student.vitdet_eval_window_size,
        list(student.windowed),
    )
    return config, backbone


def teacher_slots(
    has_summary: Mapping[str, bool], summary_slots: Mapping[str, int], num_tokens: int
) -> dict[str, int]:
    """Token slot of every teacher: its summary token, or for a teacher without summary its own
    index in RADIO's one-token-per-teacher layout (else 0); RADIO's ``token_slot``."""
    names = list(has_summary)
    per_teacher = num_tokens == len(names) > 1
    return {n: summary_slots.get(n, names.index(n) if per_teacher else 0) for n in names}


def token_slots(has_summary: Mapping[str, bool], student: Student) -> dict[str, int]:
    """The summary token each teacher reads, and for a teacher without summary the token the
    student's ``summary_tokens`` declare for it (its RADIO ``token_slot``)."""
    slots = summary_token_slots(has_summary, student)
    declared = student.summary_tokens or []
    return {**{n: declared.index(n) for n in has_summary if n in declared}, **slots}


def module_inference_model(module: Any) -> RadioLitModel:
    """:func:`inference_model` of a :class:`~radio_lit.module.DistillationModule` as it is now
    (its teachers' types from their classes)."""
    has_summary = {name: heads.summary is not None for name, heads in module.heads.items()}
    slots = teacher_slots(
        has_summary, token_slots(has_summary, module.student), module.student.num_cls_tokens
    )
    teachers = [
        teacher_entry(
            name, type(module.teachers[name]).__name__, {}, has_summary[name], slots[name]
        )
        for name in has_summary
    ]
    imported = getattr(module, "imported_heads", ImportedHeads())
    heads, spaces, teachers = imported.exported(module.heads, module.normalizers, teachers)
    return inference_model(
        module.student,
        heads,
        spaces,
        teachers,
        *module.conditioner.values,
        module.student_resolution,
    )
