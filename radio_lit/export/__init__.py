"""From a training checkpoint to an inference model (PHI-S A.6; NVlabs/RADIO's format).

- :func:`fold_affine` / :func:`fold_normalizer`: a normalizer's inverse folded into the feature
  head's last linear layer.
- :func:`inference_model` (from a student, heads and normalizers),
  :func:`module_inference_model` (from a ``DistillationModule``),
  :func:`checkpoint_inference_model` (from a ``.ckpt`` and its config): a
  :class:`RadioLitModel`, laid out as a RADIO checkpoint.
- :func:`exported_model`: :func:`checkpoint_inference_model` with the weights' source
  (checkpoint, step, raw or EMA) in its config.
- :func:`save_radio`, :func:`save_safetensors`, :func:`save_onnx`; the Hugging Face folder
  (:mod:`radio_lit.hf.folder`) carries a :func:`model_card` written from what the run logged
  for the checkpoint's step (:func:`run_metrics`);
  :func:`save_timm` / :func:`export_timm` (the backbone for timm's and transformers' C-RADIO
  classes); :func:`load` (also ``radio_lit.load``).
- ``radio-lit export`` (:mod:`radio_lit.cli.export`).
- The way back, ``model.init_from`` (:func:`initialize`): a radio-lit ``.ckpt`` or a published
  RADIO in any layout (:mod:`radio_lit.export.published`) into the student, through the one key
  map of both directions (:mod:`radio_lit.export.layout`); imported heads composed with the
  run's normalizers once fitted (:class:`ImportedHeads`); :class:`PublishedStudent`, a
  student of the source's architecture read from the source.

``radio_lit.export.export_hf``, ``save_hf`` and ``select_heads`` (the Hugging Face folder, now
:mod:`radio_lit.hf.folder`, above this layer) still resolve, as aliases
(:data:`radio_lit._aliases.MOVED_NAMES`).
"""

from typing import Any

from radio_lit._aliases import moved_name
from radio_lit.export.card import model_card
from radio_lit.export.checkpoint import checkpoint_inference_model
from radio_lit.export.convert import (
    inference_model,
    module_inference_model,
    radio_config,
    radio_incompatibilities,
)
from radio_lit.export.files import (
    load,
    read_hf,
    read_radio,
    read_safetensors,
    save_radio,
    save_safetensors,
)
from radio_lit.export.fold import fold_affine, fold_normalizer
from radio_lit.export.head_spaces import ImportedHeads
from radio_lit.export.init_from import initialize
from radio_lit.export.logged import run_metrics
from radio_lit.export.model import RadioLitModel
from radio_lit.export.onnx import save_onnx
from radio_lit.export.published_student import PublishedStudent
from radio_lit.export.source import exported_model
from radio_lit.export.timm_radio import export_timm, save_timm

__all__ = [
    "ImportedHeads",
    "PublishedStudent",
    "RadioLitModel",
    "checkpoint_inference_model",
    "export_timm",
    "exported_model",
    "fold_affine",
    "fold_normalizer",
    "inference_model",
    "initialize",
    "load",
    "model_card",
    "module_inference_model",
    "radio_config",
    "radio_incompatibilities",
    "read_hf",
    "read_radio",
    "read_safetensors",
    "run_metrics",
    "save_onnx",
    "save_radio",
    "save_safetensors",
    "save_timm",
]


def __getattr__(name: str) -> Any:
    # names that moved out of this package (radio_lit._aliases.MOVED_NAMES)
    return moved_name(__name__, name)
