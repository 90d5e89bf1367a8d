"""A user's YAML file read as a mapping, or one line saying what is wrong with it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from radio_lit.core.errors import ConfigError

__all__ = ["read_mapping"]


def read_mapping(path: Path, option: str) -> dict[str, Any]:
    """The mapping a user's YAML file ``path`` holds (``{}`` when empty); a file that is not
    readable, not YAML or not a mapping is a :class:`ConfigError` naming ``option`` and the
    place of the fault."""
    try:
        row = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{option} {path}: cannot be read ({error})") from error
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise ConfigError(f"{option} {path}: not valid YAML ({problem}{where})") from error
    if row is not None and not isinstance(row, dict):
        raise ConfigError(
            f"{option} {path}: a YAML mapping of keys is expected, got a {type(row).__name__}"
        )
    return row or {}
