"""The transformers config of an exported radio-lit model (``config.json``, ``model_type:
"radio_lit"``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from transformers import PretrainedConfig

#: ``model_type`` of radio-lit's transformers config (``config.json``).
MODEL_TYPE = "radio_lit"
#: Called whenever a :class:`RadioLitConfig` is built (:mod:`radio_lit.hf` registers the model
#: class with ``AutoModel`` there).
ON_CREATE: list[Callable[[], None]] = []


class RadioLitConfig(PretrainedConfig):
    """What :class:`~radio_lit.hf.modeling.RadioLitHFModel` is built from.

    Attributes:
        radio: the export's RADIO ``args`` fields with radio-lit's under ``radio["radio_lit"]``
            (:func:`radio_lit.export.radio_config`), the same dict as a ``.pth`` or
            ``.safetensors`` export's config.
        adaptors: ``{"_heads.<teacher>" | "_feature_projections.<teacher>": [in, hidden,
            out]}``, the adaptor MLPs' widths.
    """

    model_type = MODEL_TYPE

    radio: dict[str, Any] | None = None
    adaptors: dict[str, list[int]] | None = None

    def __post_init__(self, **kwargs: Any) -> None:
        super().__post_init__(**kwargs)
        for callback in ON_CREATE:
            callback()
