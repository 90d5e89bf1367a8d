"""The exported model of a training checkpoint and the run's config, without the teachers.

A training checkpoint holds the student, head and normalizer weights (``student.*``,
``heads.<teacher>.*``, ``normalizers.<teacher>.*``); the run's ``config.yaml`` (LightningCLI
saves it beside ``checkpoints/``) names the student architecture, the normalizer kinds, the
pixel statistics and the teachers. Teachers are never instantiated: their names, classes and
head widths are all an export needs.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import torch
import yaml

from radio_lit.export.convert import inference_model, teacher_entry, teacher_slots
from radio_lit.export.model import RadioLitModel
from radio_lit.students import TeacherHeads

#: The ``model.*`` options an export reads; the others (teachers, losses, optimizer, ...) not.
_EXPORT_OPTIONS = {
    "student",
    "student_resolution",
    "student_mean",
    "student_std",
    "normalizer",
    "normalizer_overrides",
}


def run_config(checkpoint: Path) -> Path:
    """The ``config.yaml`` LightningCLI saved for the run of ``checkpoint``
    (``<run>/checkpoints/<name>.ckpt`` -> ``<run>/config.yaml``)."""
    for folder in (checkpoint.parent.parent, checkpoint.parent):
        if (folder / "config.yaml").is_file():
            return folder / "config.yaml"
    raise FileNotFoundError(
        f"no config.yaml beside {checkpoint} or its folder's parent; pass the run's config "
        "with --config (radio-lit export) or config= (radio_lit.load)"
    )


def _model_options(config: Path) -> tuple[Any, dict[str, Any]]:
    """The instantiated export options of ``config``'s ``model`` section, and its teachers."""
    from jsonargparse import ArgumentParser

    from radio_lit.module import DistillationModule

    raw = yaml.safe_load(config.read_text()) or {}
    model = dict(raw.get("model") or {})
    teachers = model.get("teachers")
    if not teachers or "student" not in model:
        raise ValueError(
            f"{config} has no model.student or model.teachers; pass the config the run was "
            "trained with (its config.yaml)"
        )
    student = model["student"] = dict(model["student"])
    # The weights come from the checkpoint: never download or read the initial ones.
    init_args = {**student.get("init_args", {}), "checkpoint": None}
    if "pretrained" in init_args:  # CPEViT's timm weights; E-RADIO has no such option
        init_args["pretrained"] = False
    student["init_args"] = init_args
    skip = set(inspect.signature(DistillationModule).parameters) - _EXPORT_OPTIONS
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(DistillationModule, "model", skip=skip, instantiate=False)
    options = {k: v for k, v in model.items() if k in _EXPORT_OPTIONS}
    parsed = parser.parse_object({"model": options})
    return parser.instantiate_classes(parsed).model, teachers


def checkpoint_inference_model(
    checkpoint: str | Path, config: str | Path | None = None
) -> RadioLitModel:
    """The exported model (normalizers folded) of a radio-lit training checkpoint.

    Args:
        checkpoint: a ``.ckpt`` written by ``radio-lit fit``.
        config: the run's config; by default the ``config.yaml`` beside ``checkpoints/``.
    """
    checkpoint = Path(checkpoint)
    if not checkpoint.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    config = Path(config) if config is not None else run_config(checkpoint)
    options, teacher_configs = _model_options(config)
    state = torch.load(checkpoint, map_location="cpu", weights_only=True)
    state = state.get("state_dict", state)

    student = options.student
    student.load_state_dict(_strip(state, "student."), strict=True)
    student.eval()
    heads, normalizers, has_summary = {}, {}, {}
    overrides = options.normalizer_overrides or {}
    for name in teacher_configs:
        head_state = _strip(state, f"heads.{name}.")
        if not head_state:
            raise ValueError(
                f"{checkpoint} has no heads for teacher {name!r} of {config}; pass the config "
                "the checkpoint was trained with"
            )
        hidden = head_state["features.inp.weight"].shape[0]
        width = head_state["features.out.weight"].shape[0]
        summary = head_state.get("summary.out.weight")
        summary_dim = summary.shape[0] if summary is not None else None
        heads[name] = TeacherHeads(student.embed_dim, hidden, width, summary_dim)
        heads[name].load_state_dict(head_state, strict=True)
        normalizer = overrides.get(name, options.normalizer)(width)
        normalizer.load_state_dict(_strip(state, f"normalizers.{name}."), strict=True)
        normalizers[name] = normalizer
        has_summary[name] = summary_dim is not None

    from radio_lit.module import summary_token_slots

    slots = teacher_slots(
        has_summary,
        summary_token_slots(has_summary, student.num_cls_tokens),
        student.num_cls_tokens,
    )
    teachers = []
    for name, spec in teacher_configs.items():
        spec = spec if isinstance(spec, dict) else {"class_path": spec}
        class_path, init_args = str(spec.get("class_path", "")), spec.get("init_args") or {}
        teachers.append(teacher_entry(name, class_path, init_args, has_summary[name], slots[name]))
    resolution = options.student_resolution
    if isinstance(resolution, int):
        resolution = (resolution, resolution)
    return inference_model(
        student,
        heads,
        normalizers,
        teachers,
        tuple(options.student_mean or student.pixel_mean),
        tuple(options.student_std or student.pixel_std),
        tuple(resolution),
    )


def _strip(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
