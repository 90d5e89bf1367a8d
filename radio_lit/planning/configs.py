"""A config's YAML as ``radio-lit fit`` reads it: one file, or an overlay merged into its base
(what ``radio-lit plan`` and the benchmarks read before building a run)."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from radio_lit.core.yaml_files import read_mapping

__all__ = ["load_config", "merged"]


def load_config(path: str | Path) -> dict[str, Any]:
    """One YAML file as a mapping (``{}`` for an empty file); one that is not is a
    :class:`~radio_lit.core.errors.ConfigError` naming it."""
    return read_mapping(Path(path), "--config")


def merged(files: Sequence[str | Path]) -> dict[str, Any]:
    """The raw YAMLs as later ``--config`` files merge into earlier ones (mappings merged key
    by key, a class entry with another ``class_path`` replaced, lists replaced)."""
    out: dict[str, Any] = {}
    for path in files:
        out = _merge(out, load_config(path))
    return out


def _merge(base: Any, over: Any) -> Any:
    if not isinstance(base, dict) or not isinstance(over, dict):
        return copy.deepcopy(over)
    if "class_path" in over and over.get("class_path") != base.get("class_path"):
        return copy.deepcopy(over)
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(base.get(key), value) if key in base else copy.deepcopy(value)
    return out
