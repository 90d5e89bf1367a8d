"""The ``radio-lit`` command and its subcommands.

- :mod:`.app`: :class:`~radio_lit.cli.app.RadioLitCLI` (a LightningCLI) and :func:`main`;
- :mod:`.commands`: the command list ``radio-lit`` prints;
- :mod:`.class_parsers`, :mod:`.overlays`: building and composing configs;
- :mod:`.runs`, :mod:`.results`, :mod:`.hub`: run folders and resume, the results table,
  hub downloads;
- subcommands: :mod:`.predict`, :mod:`.evaluate`, :mod:`.export`, :mod:`.cache` (``radio-lit
  ablate`` is :mod:`radio_lit.ablation.runner`).

``radio_lit.cli.RadioLitCLI`` and ``radio_lit.cli.main`` are imported on first use, so that
``import radio_lit.cli.overlays`` does not import Lightning.
"""

from __future__ import annotations

import importlib
from typing import Any


def __getattr__(name: str) -> Any:
    if name.startswith("__"):  # import machinery probing the package (__path__ is set)
        raise AttributeError(name)
    value = getattr(importlib.import_module("radio_lit.cli.app"), name, None)
    if value is None:
        raise AttributeError(f"module 'radio_lit.cli' has no attribute {name!r}")
    return value
