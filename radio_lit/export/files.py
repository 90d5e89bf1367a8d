"""Writing and reading exported models.

- RADIO format (``.pth``): ``{"args": argparse.Namespace(**config), "state_dict": {...}}``, what
  NVlabs/RADIO's ``torch.hub.load('NVlabs/RADIO', 'radio_model', version=<file>,
  adaptor_names=[...])`` loads (it unpickles ``args``); radio-lit reads it with
  ``torch.load(weights_only=True)``, allowing only ``argparse.Namespace``.
- safetensors: the same tensors under the same names in ``<stem>.safetensors``, and the same
  config as JSON in ``<stem>.json`` beside it; nothing is unpickled.
"""

from __future__ import annotations

import json
import os
import re
from argparse import Namespace
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from radio_lit.core.errors import ConfigError
from radio_lit.export.convert import radio_incompatibilities
from radio_lit.export.model import RadioLitModel, to_radio_keys

RADIO_SUFFIXES = (".pth", ".pt", ".tar")
#: A Hugging Face model folder's config and weights (:mod:`radio_lit.hf.folder`), the
#: weights under this prefix (radio-lit's layer names).
CONFIG_NAME, WEIGHTS_NAME, HF_PREFIX = "config.json", "model.safetensors", "radio_model."
#: A Hugging Face Hub model id, ``owner/name``.
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


def save_radio(model: RadioLitModel, path: str | Path) -> Path:
    """Write ``model`` as a RADIO-format checkpoint; refuse what RADIO would load differently."""
    problems = radio_incompatibilities(model.config)
    if problems:
        raise ValueError(
            "this student cannot be written in NVlabs/RADIO's format without changing its "
            "outputs: " + "; ".join(problems) + " (the safetensors export has no such limits)"
        )
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # A deep copy of plain values, so that the loader's edits to args (it pops from
    # model_kwargs) never reach the model's config.
    args = Namespace(**json.loads(json.dumps(model.config)))
    torch.save({"args": args, "state_dict": model.radio_state_dict()}, path)
    return path


def save_safetensors(model: RadioLitModel, path: str | Path) -> tuple[Path, Path]:
    """Write ``<stem>.safetensors`` (RADIO key names) and ``<stem>.json`` (the config)."""
    path = Path(path).with_suffix(".safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    save_umask_file(model.radio_state_dict(), path)
    config_path = path.with_suffix(".json")
    config_path.write_text(json.dumps(model.config, indent=2) + "\n")
    return path, config_path


def save_umask_file(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """``safetensors.torch.save_file`` (metadata ``format: pt``), the file then given the mode
    the process's umask gives new files (``0644`` under umask ``022``), as ``torch.save`` and
    ``open`` do: safetensors creates it ``0600``, unreadable to colleagues on a shared cluster."""
    save_file(tensors, str(path), metadata={"format": "pt"})
    umask = os.umask(0o022)  # reading the umask means setting it: set it back at once
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def read_radio(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(config, state_dict)`` of a RADIO-format file, unpickling nothing but Namespace."""
    with torch.serialization.safe_globals([Namespace]):
        checkpoint = torch.load(path, map_location="cpu", weights_only=True)
    return vars(checkpoint["args"]), checkpoint["state_dict"]


def read_safetensors(path: str | Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """``(config, state_dict)`` of a safetensors export and the JSON config beside it."""
    path = Path(path)
    config_path = path.with_suffix(".json")
    if not config_path.is_file():
        if path.name == WEIGHTS_NAME:  # a Hugging Face folder's weights: the folder loads
            model_file(path.parent)  # no config.json there: says how to write it again
            raise FileNotFoundError(
                f"{path} is the weights file of a Hugging Face folder: give the folder "
                f"{path.parent}"
            )
        raise FileNotFoundError(
            f"{config_path} (the config of {path}) does not exist; radio-lit export writes both "
            "(--format safetensors)"
        )
    return json.loads(config_path.read_text()), load_file(str(path))


def model_file(path: str | Path, option: str | None = None) -> Path:
    """``path`` checked as a model for :func:`load`: a file, a Hugging Face model folder
    (``config.json`` inside) or a Hub id (``owner/name``, no such local path). Anything else (a
    missing path, another folder, named with the model files in it) raises
    ``FileNotFoundError`` prefixed with ``option``."""
    path = Path(path).expanduser()
    if path.is_file() or (path / CONFIG_NAME).is_file():  # a file, or a Hugging Face folder
        return path
    if (path / ".metadata").is_file():  # the folder of a sharded .ckpt
        return path
    if not path.exists() and HUB_ID.fullmatch(str(path)):
        return path
    prefix = f"{option}: " if option else ""
    if path.is_dir() and (path / WEIGHTS_NAME).is_file():  # a Hugging Face folder, incomplete
        raise FileNotFoundError(
            f"{prefix}{path} holds {WEIGHTS_NAME} but no {CONFIG_NAME}, which describes the "
            "model: restore it, or export the folder again (radio-lit export CHECKPOINT "
            f"--format hf --output {path} --overwrite)"
        )
    if path.is_dir():
        found = sorted(p.name for p in path.iterdir() if _loads_alone(p))
        inside = (
            "give one of its files: " + ", ".join(found)
            if found
            else "it holds no model radio-lit loads (a .safetensors with its .json, a .pth, a "
            ".ckpt beside its run's config.yaml; radio-lit export writes them)"
        )
        raise FileNotFoundError(f"{prefix}{path} is a folder, not a model file; {inside}")
    raise FileNotFoundError(
        f"{prefix}{path} does not exist; give a .safetensors or .pth written by radio-lit "
        "export, a training .ckpt, or a folder from radio-lit export --format hf"
    )


def _loads_alone(path: Path) -> bool:
    """Whether :func:`load` reads the file ``path`` as it is: a ``.safetensors`` with its
    ``.json``, a RADIO-format file, a ``.ckpt`` with its run's ``config.yaml`` where
    ``radio-lit fit`` writes it."""
    if not path.is_file():
        return False
    if path.suffix == ".safetensors":
        return path.with_suffix(".json").is_file()
    if path.suffix == ".ckpt":
        return any((f / "config.yaml").is_file() for f in (path.parent, path.parent.parent))
    return path.suffix in RADIO_SUFFIXES


def refuse_overwrite(paths: Iterable[Path], prog: str) -> None:
    """Refuse (:class:`~radio_lit.core.errors.ConfigError`, one line naming ``--overwrite``) to
    write where something already is: an existing file among ``paths``, or a folder that is
    not empty. Commands call it unless ``--overwrite`` was given."""
    for path in paths:
        if path.is_dir():
            inside = sorted(p.name for p in path.iterdir())
            if inside:
                shown = ", ".join(inside[:4]) + (", ..." if len(inside) > 4 else "")
                raise ConfigError(
                    f"{prog}: {path} is not empty ({shown}); give --overwrite to write into it "
                    "(files of the same names are replaced), or another --output"
                )
        elif path.exists() or path.is_symlink():
            raise ConfigError(
                f"{prog}: {path} already exists; give --overwrite to replace it, or another "
                "--output"
            )


def read_hf(folder: str | Path, pad: bool = False) -> RadioLitModel:
    """The model of a Hugging Face folder from ``radio-lit export --format hf`` (transformers
    not needed: ``config.json``'s ``radio`` entry and ``model.safetensors``)."""
    folder = Path(folder)
    for name in (CONFIG_NAME, WEIGHTS_NAME):
        if not (folder / name).is_file():
            raise FileNotFoundError(
                f"{folder} has no {name}: expected a folder written by radio-lit export --format hf"
            )
    config = json.loads((folder / CONFIG_NAME).read_text())
    calls = (config.get("radio_lit") or {}).get("calls") or {}
    if "radio" not in config and calls:  # radio-lit export --format timm: the backbone alone
        raise ValueError(
            f"{folder} is a radio-lit export --format timm folder (the backbone alone, for "
            f"timm's and transformers' C-RADIO classes): load it with {calls['transformers']} "
            f"or {calls['naflexvit']}; radio_lit.load takes the checkpoint's other exports "
            "(.safetensors, --format hf), which keep the teachers' heads"
        )
    if "radio" not in config:
        raise ValueError(
            f"{folder / CONFIG_NAME} was not written by radio-lit export (no 'radio' entry, "
            f"model_type {config.get('model_type')!r})"
        )
    weights = load_file(str(folder / WEIGHTS_NAME))
    state = {k[len(HF_PREFIX) :]: v for k, v in weights.items() if k.startswith(HF_PREFIX)}
    return RadioLitModel.from_radio(config["radio"], to_radio_keys(state), pad=pad)


def hub_snapshot(repo_id: str) -> Path:
    """The local folder of Hub model ``repo_id``'s config and weights (``huggingface_hub``'s
    cache; downloaded if missing and the Hub is reachable)."""
    from huggingface_hub import snapshot_download

    try:
        folder = snapshot_download(repo_id, allow_patterns=[CONFIG_NAME, WEIGHTS_NAME])
    except Exception as error:  # offline, unknown repository, no access: one line
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise FileNotFoundError(
            f"{repo_id} is no local path, and the Hub model of that id cannot be had ({first}); "
            "give a local file or folder, or a Hub id that is cached or reachable"
        ) from error
    return Path(folder)


def load(
    path: str | Path,
    pad: bool = False,
    config: str | Path | None = None,
    backbone_summary: str = "first",
) -> RadioLitModel:
    """The inference model of an export, a training checkpoint or a Hugging Face model, in eval
    mode on the CPU.

    ``model(images)`` takes ``[B, 3, H, W]`` images in ``[0, 1]`` and returns
    ``{"backbone": TeacherOutput, <teacher>: TeacherOutput}``, teacher outputs in each
    teacher's own space (see :class:`~radio_lit.export.model.RadioLitModel`).

    Args:
        path: ``<stem>.safetensors`` (with ``<stem>.json`` beside it), a RADIO-format
            ``.pth`` from ``radio-lit export``, a training ``.ckpt`` (exported on the fly; a
            file, or the folder of a sharded checkpoint), a folder from ``radio-lit export
            --format hf``, or the Hub id of such a folder (``owner/name``, downloaded with
            ``huggingface_hub`` into its cache).
        pad: accept any resolution, zero-padding the normalized image to a multiple of the
            patch size; otherwise ``H`` and ``W`` must be multiples of it.
        config: for a ``.ckpt``, the run's config (default: its ``config.yaml``).
        backbone_summary: ``"first"``: ``outputs["backbone"].summary`` is the first summary
            token, ``[B, D]``; ``"summary_idxs"``: NVlabs' loader's, the summary teachers'
            tokens concatenated, ``[B, k D]`` (C-RADIOv4: ``k = 2``).
    """
    model = _load(path, pad, config)
    model.backbone_summary = backbone_summary
    return model


def _load(path: str | Path, pad: bool, config: str | Path | None) -> RadioLitModel:
    path = model_file(path)
    if path.suffix == ".ckpt" or (path / ".metadata").is_file():  # a file or sharded folder
        from radio_lit.export.checkpoint import checkpoint_inference_model

        model = checkpoint_inference_model(path, config)
        model.pad = pad
        return model
    if path.is_dir():
        return read_hf(path, pad=pad)
    if not path.exists():
        return read_hf(hub_snapshot(str(path)), pad=pad)
    if path.suffix == ".safetensors":
        settings, state = read_safetensors(path)
    elif path.suffix in RADIO_SUFFIXES:
        settings, state = read_radio(path)
    else:
        raise ValueError(
            f"{path}: expected a .safetensors, RADIO-format .pth or training .ckpt file"
        )
    if "radio_lit" not in settings:
        raise ValueError(
            f"{path} was not written by radio-lit export (no radio_lit config): start a run "
            "from it with model.init_from, or as a RADIOTeacher set loader: torch_hub, "
            "hub_repo: <a clone of NVlabs/RADIO>, trust_remote_code: true (NVlabs' code "
            "needs einops)"
        )
    return RadioLitModel.from_radio(settings, state, pad=pad)
