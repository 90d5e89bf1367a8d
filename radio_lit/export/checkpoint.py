"""The exported model of a training checkpoint and the run's config, without the teachers.

A training checkpoint holds the student, head and normalizer weights (``student.*``,
``heads.<teacher>.*``, ``normalizers.<teacher>.*``); the run's ``config.yaml`` (LightningCLI
saves it beside ``checkpoints/``) names the student architecture, the normalizer kinds, the
pixel statistics and the teachers. Teachers are never instantiated: their names, classes and
head widths are all an export needs.
"""

from __future__ import annotations

import importlib
import inspect
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from radio_lit.core.yaml_files import read_mapping
from radio_lit.export.convert import inference_model, teacher_entry, teacher_slots, token_slots
from radio_lit.export.head_spaces import ImportedHeads
from radio_lit.export.model import RadioLitModel
from radio_lit.normalizers import Identity, Normalizer
from radio_lit.students import Student, TeacherHeads
from radio_lit.students.conditioner import saved_conditioner

log = logging.getLogger(__name__)

#: Prefixes of the trained weights in a training checkpoint's ``state_dict``.
STUDENT_PREFIXES = ("student.", "heads.")
#: Prefix of the EMA student and heads (``model.mesa``; C-RADIOv4 report 2.3.2).
EMA_PREFIX = "ema."
#: Prefix of the teachers' weights in the training module, which checkpoints leave out.
TEACHER_PREFIX = "teachers."


@dataclass
class ExportOptions:
    """The ``model.*`` options an export reads (same names, types and defaults as
    ``DistillationModule``'s); the others (teachers, losses, optimizer, ...) are not read."""

    student: Student
    student_resolution: int | tuple[int, int] = 256
    student_mean: tuple[float, float, float] | None = None
    student_std: tuple[float, float, float] | None = None
    normalizer: Callable[[int], Normalizer] = Identity
    normalizer_overrides: dict[str, Callable[[int], Normalizer]] | None = None


_EXPORT_OPTIONS = {f.name for f in fields(ExportOptions)}


def student_weights(
    checkpoint: str | Path,
    own_keys: Iterable[str],
    teachers: Iterable[str],
    state: Mapping[str, Tensor] | None = None,
) -> tuple[dict[str, Tensor], list[str]]:
    """The student, head and EMA weights of an earlier stage's checkpoint (``model.init_from``).

    The EMA student runs for the whole of training (RADIO #181): a module with an EMA
    (``ema.*`` among ``own_keys``) takes the earlier stage's ``ema.*``, or, from a checkpoint
    without one, starts its EMA at the loaded student and heads. A checkpoint's EMA is left
    out when this stage has none.

    Args:
        checkpoint: a ``.ckpt`` written by ``radio-lit fit``.
        own_keys: the state-dict keys of the module to load into (its ``state_dict()``:
            the shapes are checked too).
        teachers: the module's teacher names.
        state: the checkpoint's ``state_dict`` when the caller has read it already
            (:func:`training_state`).

    Returns:
        the weights, and the teachers new in this stage (AM-RADIO 4: SAM joins in stage 2),
        which have no heads in the checkpoint: their heads (and EMA heads) start fresh.

    Raises:
        FileNotFoundError, ValueError: one line naming the file and what to pass instead.
    """
    path = Path(checkpoint)
    state = training_state(path) if state is None else state
    weights = {k: v for k, v in state.items() if k.startswith(STUDENT_PREFIXES)}
    if not weights:
        raise ValueError(f"{path} holds no student or head weights (no 'student.*' keys)")
    own_state, own_keys = own_keys, set(own_keys)
    own = {k for k in own_keys if k.startswith(STUDENT_PREFIXES)}
    new = [n for n in teachers if not any(k.startswith(f"heads.{n}.") for k in weights)]
    fresh = {k for k in own if k.startswith(tuple(f"heads.{n}." for n in new))}
    _check_keys(path, own - fresh, set(weights))
    if any(k.startswith(EMA_PREFIX) for k in own_keys):
        ema = {k: v for k, v in state.items() if k.startswith(EMA_PREFIX)}
        if not ema:
            log.info("model.init_from: %s has no EMA; the EMA starts at its weights", path)
            ema = {EMA_PREFIX + k: v for k, v in weights.items()}
        _check_keys(path, {k for k in own_keys if k.startswith(EMA_PREFIX)}, set(ema), fresh)
        weights.update(ema)
    elif any(k.startswith(EMA_PREFIX) for k in state):
        log.info("model.init_from: the EMA of %s is not carried (no model.mesa here)", path)
    if isinstance(own_state, Mapping):
        _check_shapes(path, own_state, weights)
    if new:
        log.info("model.init_from: heads of teachers new in this stage start fresh: %s", new)
    return weights, new


def training_state(path: Path) -> dict[str, Tensor]:
    """The ``state_dict`` of an earlier stage's checkpoint (``model.init_from``), or one line
    naming the file and what to pass instead."""
    if not is_checkpoint(path):
        raise FileNotFoundError(
            f"model.init_from: checkpoint {path} does not exist; point it at the previous "
            "stage's .ckpt (e.g. lightning_logs/version_0/checkpoints/last.ckpt)"
        )
    try:
        state = read_training_checkpoint(path)
    except Exception as error:  # truncated, not a checkpoint, or pickled objects
        raise ValueError(
            f"model.init_from: {path} cannot be read as a checkpoint "
            f"({str(error).splitlines()[0]}); point it at "
            "a .ckpt written by radio-lit fit"
        ) from error
    return state.get("state_dict", state) if isinstance(state, dict) else {}


def _check_shapes(path: Path, own: Mapping[str, Any], saved: Mapping[str, Tensor]) -> None:
    """Refuse weights of another size than this module's (e.g. another summary-token count;
    sizes, not shapes: a CPE grid saved in its former layout is converted on load)."""
    for key, value in saved.items():
        shape = getattr(own.get(key), "shape", None)
        if shape is not None and torch.Size(shape).numel() != value.numel():
            raise ValueError(
                f"model.init_from: {key} is {list(value.shape)} in {path} but "
                f"{list(shape)} here; the student must have the earlier stage's architecture "
                "and tokens (declare every stage's summary tokens from the first with "
                "model.student.init_args.summary_tokens)"
            )


def _check_keys(path: Path, own: set[str], saved: set[str], fresh: Iterable[str] = ()) -> None:
    """Refuse a checkpoint whose keys are not this module's (but for ``fresh`` heads, given
    without their ``ema.`` prefix)."""
    fresh = {*fresh, *(EMA_PREFIX + k for k in fresh)}
    missing, unexpected = sorted(own - saved - fresh), sorted(saved - own)
    if missing or unexpected:
        raise ValueError(
            f"{path} does not match this student/heads: missing {missing[:5]}, "
            f"unexpected {unexpected[:5]}; the student architecture and teacher names "
            "must be the same as in the earlier stage (teachers may only be added)"
        )


def is_sharded_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a sharded checkpoint folder: what Lightning's
    ``ModelParallelStrategy(save_distributed_checkpoint=True)`` writes in place of a ``.ckpt``
    file (``torch.distributed.checkpoint`` shards ``__<rank>_0.distcp`` with their
    ``.metadata``, and ``meta.pt`` with the loops', callbacks' and schedulers' state)."""
    return path.is_dir() and (path / ".metadata").is_file()


def is_checkpoint(path: Path) -> bool:
    """Whether ``path`` is a ``.ckpt`` file or a sharded checkpoint folder."""
    return path.is_file() or is_sharded_checkpoint(path)


def read_training_checkpoint(path: str | Path) -> dict[str, Any]:
    """A ``radio-lit fit`` checkpoint as one dict (``state_dict``, ``global_step``, …): a
    ``.ckpt`` file (tensors only, ``weights_only=True``), or a sharded checkpoint folder
    consolidated in CPU memory (Lightning's reader of distributed checkpoints)."""
    path = Path(path)
    if is_sharded_checkpoint(path):
        from lightning.fabric.utilities.load import _load_distributed_checkpoint

        return _load_distributed_checkpoint(path)
    return torch.load(path, map_location="cpu", weights_only=True)


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

    model = dict(read_mapping(config, "--config").get("model") or {})
    teachers = model.get("teachers")
    if not teachers or "student" not in model:
        raise ValueError(
            f"{config} has no model.student or model.teachers; pass the config the run was "
            "trained with (its config.yaml)"
        )
    student = model["student"] = dict(model["student"])
    # The weights come from the checkpoint: never download or read the initial ones.
    init_args = dict(student.get("init_args", {}))
    module, _, name = str(student.get("class_path", "")).rpartition(".")
    options = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    for option, value in (("checkpoint", None), ("pretrained", False)):
        if option in options:  # CPEViT's timm weights; E-RADIO, PublishedStudent have neither
            init_args[option] = value
    student["init_args"] = init_args
    parser = ArgumentParser(exit_on_error=False)
    parser.add_class_arguments(ExportOptions, "model", instantiate=False)
    options = {k: v for k, v in model.items() if k in _EXPORT_OPTIONS}
    parsed = parser.parse_object({"model": options})
    return parser.instantiate_classes(parsed).model, teachers


def checkpoint_inference_model(
    checkpoint: str | Path, config: str | Path | None = None, ema: bool = False
) -> RadioLitModel:
    """The exported model (normalizers folded) of a radio-lit training checkpoint.

    Args:
        checkpoint: a ``.ckpt`` written by ``radio-lit fit``.
        config: the run's config; by default the ``config.yaml`` beside ``checkpoints/``.
        ema: export the EMA student and heads (``ema.*``, ``model.mesa``; C-RADIOv4 report
            2.3.2) instead of the raw weights, as NVlabs' loaders prefer ``state_dict_ema``.
    """
    checkpoint = Path(checkpoint)
    if not is_checkpoint(checkpoint):
        raise FileNotFoundError(f"checkpoint {checkpoint} does not exist")
    config = Path(config) if config is not None else run_config(checkpoint)
    options, teacher_configs = _model_options(config)
    state = read_training_checkpoint(checkpoint)
    state = state.get("state_dict", state)
    if ema:
        averaged = _strip(state, "ema.")
        if not averaged:
            raise ValueError(
                f"{checkpoint} holds no EMA weights (ema.*): train with model.mesa, or export "
                "without --ema"
            )
        state = {**state, **averaged}

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
        heads[name] = TeacherHeads.from_state(head_state)  # each head's own depth
        heads[name].load_state_dict(head_state, strict=True)
        width, summary_dim = heads[name].features.out.out_features, heads[name].summary
        normalizer = overrides.get(name, options.normalizer)(width)
        normalizer.load_state_dict(_strip(state, f"normalizers.{name}."), strict=True)
        normalizers[name] = normalizer
        has_summary[name] = summary_dim is not None

    slots = teacher_slots(has_summary, token_slots(has_summary, student), student.num_cls_tokens)
    teachers = []
    for name, spec in teacher_configs.items():
        spec = spec if isinstance(spec, dict) else {"class_path": spec}
        class_path, init_args = str(spec.get("class_path", "")), spec.get("init_args") or {}
        teachers.append(teacher_entry(name, class_path, init_args, has_summary[name], slots[name]))
    imported = ImportedHeads()  # a published model's heads (model.init_from), as trained
    imported.load_state_dict(_strip(state, "imported_heads."), strict=True)
    heads, normalizers, teachers = imported.exported(heads, normalizers, teachers)
    resolution = options.student_resolution
    if isinstance(resolution, int):
        resolution = (resolution, resolution)
    mean, std = saved_conditioner(state) or (  # what the run trained with, else the config's
        options.student_mean or student.pixel_mean,
        options.student_std or student.pixel_std,
    )
    return inference_model(
        student, heads, normalizers, teachers, tuple(mean), tuple(std), tuple(resolution)
    )


def _strip(state: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}


def keep_teacher_weights(module: Any) -> None:
    """The training module's ``load_state_dict`` keeps its teachers' weights: they are never
    saved in a checkpoint (they reload from their source), so a pre-hook gives the state the
    ``teachers.*`` keys it lacks, the teachers' own tensors. None is missing then, and no
    teacher's own loading sees a key missing (NVlabs' LayerScale, ``radio/dinov2_arch.py``,
    raises on one whatever ``strict``: a stage 2 or a resume with such a RADIO teacher)."""
    module.register_load_state_dict_pre_hook(_own_teacher_weights)


def _own_teacher_weights(
    module: Any, state_dict: dict[str, Any], prefix: str, *args: Any, **kwargs: Any
) -> None:
    # Teacher.state_dict is empty (a wrapped teacher's too): each module's own tensors, every
    # name of a module shared by several entries (one RADIO model for each of its outputs).
    at = prefix + TEACHER_PREFIX.rstrip(".")
    teachers = module.teachers.named_modules(prefix=at, remove_duplicate=False)
    for name, part in teachers:
        own: dict[str, Any] = {}
        part._save_to_state_dict(own, name + ".", False)
        for key, value in own.items():
            state_dict.setdefault(key, value)
