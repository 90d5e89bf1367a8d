"""A user's YAML file read as a mapping, or one line saying what is wrong with it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from radio_lit.core.errors import ConfigError

__all__ = ["config_files", "read_mapping"]


def read_mapping(path: Path, option: str) -> dict[str, Any]:
    """The mapping a user's YAML file ``path`` holds (``{}`` when empty); a file that is not
    readable, not YAML or not a mapping is a :class:`ConfigError` naming ``option`` and the
    place of the fault."""
    try:
        loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml's, where built
        row = yaml.load(path.read_text(encoding="utf-8"), Loader=loader)
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


def config_files(command_line: Sequence[str]) -> list[str]:
    """The files that a command line's ``--config FILE`` and ``--config=FILE`` name, in order."""
    return [
        arg.split("=", 1)[1] if arg.startswith("--config=") else command_line[i + 1]
        for i, arg in enumerate(command_line)
        if (arg == "--config" and i + 1 < len(command_line)) or arg.startswith("--config=")
    ]
