"""Every YAML under ``configs/``, built by radio-lit's own CLI once per test session.

The configs are found by globbing (:func:`benchmarks.gpu_check.shipped_configs`), so a new
YAML is built by the tests the day it is added. Each is built by ``RadioLitCLI`` as
``radio-lit fit`` builds it (:func:`benchmarks.gpu_check.build`, on
:func:`benchmarks.harness.build`), on this machine's one CPU:

- :func:`built`: the config with its student at its real architecture (a GPU recipe's on the
  meta device: shapes only), its teachers replaced by tiny models of the same families with
  the same names (what a CPU-sized config ships is kept), its partitions as configured;
- :func:`cpu_sized`: a GPU recipe at CPU size (a 2-block, width-64 student of the same timm
  family, tiny teachers, 32-64 px), which takes optimizer steps.

Builds are cached by name: the modules of ``tests/configs`` share them (and run in one
pytest-xdist worker: ``tests/conftest.py``).
"""

from __future__ import annotations

import atexit
import copy
import functools
import shutil
import sys
from pathlib import Path
from typing import Any
from unittest import mock

from benchmarks.gpu_check import ShippedConfig, build, merged, own_module, shipped_configs
from radio_lit.planning.configs import load_config

ROOT = Path(__file__).resolve().parents[2]
CONFIGS: dict[str, ShippedConfig] = {c.name: c for c in shipped_configs(ROOT)}


def raw(name: str) -> dict[str, Any]:
    """The config's YAML as ``radio-lit fit`` reads it (an overlay merged into its base)."""
    return copy.deepcopy(_raw(name))


@functools.cache
def _raw(name: str) -> dict[str, Any]:
    return merged(CONFIGS[name].files)


def gpu_recipe(name: str) -> bool:
    """Whether ``name`` is sized for GPUs (its ``trainer.accelerator`` is not ``cpu``)."""
    return (raw(name).get("trainer") or {}).get("accelerator") != "cpu"


def layout_overlay(name: str) -> bool:
    """Whether ``name`` is an overlay that lays a GPU recipe's partitions out anew
    (``recipes/c-radio/balanced.yaml``, ``packed.yaml``), stacked on any of its stages."""
    config = CONFIGS[name]
    return (
        bool(config.overlay)
        and gpu_recipe(name)
        and "partitions" in (load_config(config.path).get("model") or {})
    )


@functools.cache
def built(name: str) -> Any:
    """The ``RadioLitCLI`` of config ``name`` built for this machine (see the module
    docstring); a GPU recipe without its ``model.init_from`` (the chain tests load it)."""
    extra = ["--trainer.accelerator=cpu", "--trainer.max_steps=1"]
    if gpu_recipe(name) and not own_module(raw(name)):
        extra.append("--model.init_from=null")
    meta = "meta" if gpu_recipe(name) else None
    return _build(name, size="build", student_device=meta, extra=extra)


def cpu_sized(name: str, *extra: str) -> Any:
    """The ``RadioLitCLI`` of GPU recipe ``name`` at CPU size, for one optimizer step."""
    args = ["--trainer.accelerator=cpu", "--trainer.max_steps=1", *extra]
    return _build(name, size="cpu", extra=args)


def _build(name: str, **options: Any) -> Any:
    """:func:`benchmarks.gpu_check.build` as ``radio-lit`` with nothing more on its command
    line; the run folder (empty: no logger, no checkpoints) is removed when the tests end."""
    with mock.patch.object(sys, "argv", ["radio-lit"]):
        cli = build(CONFIGS[name], keep_strategy=False, **options)
    atexit.register(shutil.rmtree, cli.trainer.default_root_dir, ignore_errors=True)
    return cli


def model_id_problems(kind: str, init: dict[str, Any]) -> list[str]:
    """Why the model a config names is not what its library knows (empty when it is): timm
    names and pretrained tags in timm's registry, open_clip names and tags in
    ``open_clip.list_pretrained()``, SAM's model types, the form of a Hugging Face Hub id.
    Local files and directories cannot be checked and are accepted."""
    if isinstance(init.get("teacher"), dict):  # RescaledTeacher, FixedPatternTeacher
        inner = init["teacher"]
        return model_id_problems(inner["class_path"].rsplit(".", 1)[-1], inner.get("init_args"))
    init = init or {}
    if kind == "CPEViT":
        return _timm_problems(init.get("model", "vit_base_patch16_224"), init.get("pretrained"))
    if kind == "OpenCLIPTeacher":
        return _open_clip_problems(init["model_name"], init.get("pretrained"), init)
    if kind in ("DINOv2Teacher", "DINOv3Teacher", "TimmTeacher"):
        if init.get("backend", "timm") != "timm":
            return _hub_problems(init["model"])
        return _timm_problems(init["model"], init.get("pretrained", True))
    if kind == "SAMTeacher":
        from segment_anything import sam_model_registry

        model_type = init.get("model_type")
        if model_type is not None and model_type not in sam_model_registry:
            return [f"SAM model type {model_type!r} is none of {sorted(sam_model_registry)}"]
        return []
    if kind == "RADIOTeacher" and init.get("loader", "export") == "export":
        return []  # a radio-lit export: a local file (configs/recipes/adapt's twin makes one)
    if kind in ("SAM2Teacher", "SAM3Teacher", "TransformersTeacher", "RADIOTeacher"):
        from radio_lit.teachers.transformers_teacher import is_model_type

        model = init["model"]
        return (
            []
            if is_model_type(model) and not init.get("pretrained", True)
            else _hub_problems(model)
        )
    if kind == "ERadio":
        return []
    return [f"no model id check for {kind}: add one to tests/configs/shipped.py"]


def _timm_problems(model: str, pretrained: Any) -> list[str]:
    import timm

    name, tag = timm.models.split_model_name_tag(model)
    if name not in timm.list_models():
        return [f"{name!r} is not a timm model"]
    if tag and model not in timm.list_pretrained(name):
        return [
            f"{model!r}: timm has no pretrained tag {tag!r} (it has {timm.list_pretrained(name)})"
        ]
    if pretrained and not tag and not timm.list_pretrained(name):
        return [f"{name!r} has no pretrained weights in timm (pretrained: true)"]
    return []


def _open_clip_problems(name: str, pretrained: str | None, init: dict[str, Any]) -> list[str]:
    import open_clip

    if name.startswith("hf-hub:"):
        return _hub_problems(name.removeprefix("hf-hub:"))
    if name.startswith("local-dir:") or init.get("model_cfg"):
        return []
    if name not in open_clip.list_models():
        return [f"{name!r} is not an open_clip model"]
    tagged = pretrained and not _looks_like_path(pretrained)
    if tagged and (name, pretrained) not in open_clip.list_pretrained():
        tags = open_clip.list_pretrained_tags_by_model(name)
        return [f"open_clip has no pretrained tag {pretrained!r} for {name!r} ({tags})"]
    return []


def _hub_problems(model: str) -> list[str]:
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    if model.startswith(("/", "./", "../", "~")):
        return []  # a local directory
    try:
        validate_repo_id(model)
    except HFValidationError as error:
        return [f"{model!r} is no Hugging Face Hub id: {error}"]
    return [] if model.count("/") == 1 else [f"{model!r} is no Hub id of the form org/name"]


def _looks_like_path(value: str) -> bool:
    return value.startswith(("/", "./", "../", "~")) or value.endswith(
        (".pt", ".pth", ".bin", ".safetensors", ".ckpt")
    )
