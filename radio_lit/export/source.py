"""Which weights an export holds: the checkpoint it came from, that checkpoint's optimizer
step, and the raw student or its EMA (C-RADIOv4 report 2.3.2).

``radio-lit export`` records them in the exported config under ``radio_lit.source``, so they
travel in every format: ``<stem>.json`` beside the safetensors, the ``.pth``'s ``args``, the
ONNX metadata and a Hugging Face folder's ``config.json``
(``radio_lit.load(path).config["radio_lit"]["source"]``)::

    {"checkpoint": "lightning_logs/quickstart/version_0/checkpoints/last.ckpt",
     "step": 300, "weights": "raw"}

``checkpoint`` is the path as given on the command line (a published folder carries no more
of the exporting machine's paths than the user typed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from radio_lit.export.checkpoint import checkpoint_inference_model, is_sharded_checkpoint
from radio_lit.export.model import RadioLitModel

#: ``radio_lit.source["weights"]`` of the student as trained, and of its EMA (``--ema``).
RAW, EMA = "raw", "ema"
#: What Lightning writes beside the shards of a sharded checkpoint: every state but the tensors.
_SHARDED_META = "meta.pt"


def checkpoint_step(checkpoint: str | Path) -> int | None:
    """The optimizer step (``global_step``) a ``radio-lit fit`` checkpoint was saved at, read
    without loading its tensors (a ``.ckpt`` file memory-mapped; a sharded checkpoint's
    ``meta.pt``); ``None`` when it records none (a checkpoint written by other code)."""
    path = Path(checkpoint)
    if is_sharded_checkpoint(path):
        state = torch.load(path / _SHARDED_META, map_location="cpu", weights_only=True)
    else:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    step = state.get("global_step") if isinstance(state, dict) else None
    return int(step) if step is not None else None


def exported_model(
    checkpoint: str | Path, config: str | Path | None = None, ema: bool = False
) -> RadioLitModel:
    """:func:`~radio_lit.export.checkpoint.checkpoint_inference_model` with its source
    recorded in ``model.config["radio_lit"]["source"]`` (see the module docstring)."""
    model = checkpoint_inference_model(checkpoint, config, ema)
    model.config["radio_lit"]["source"] = source(checkpoint, ema)
    return model


def source(checkpoint: str | Path, ema: bool) -> dict[str, Any]:
    """``{"checkpoint", "step", "weights"}`` of an export of ``checkpoint``."""
    return {
        "checkpoint": str(checkpoint),
        "step": checkpoint_step(checkpoint),
        "weights": EMA if ema else RAW,
    }
