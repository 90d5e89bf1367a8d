"""Overlay configs: a YAML that sets part of a run, meant to be stacked on a full config.

``configs/quickstart-eradio.yaml`` (a student), ``configs/ablations/<row>.yaml`` (a
normalizer / loss / balancer) and ``callbacks/*.yaml`` (callbacks) set no ``data``: given alone,
``radio-lit fit --config OVERLAY`` fails in jsonargparse with "Option 'fit.data' is required".
:func:`overlay_error` turns that into one line saying the config is an overlay and which full
config to put before it: the one its own comments show (``radio-lit fit --config BASE --config
OVERLAY``), else a ``base.yaml`` beside it (the ablation rows' layout), else a shipped one.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

import yaml

#: jsonargparse's message for a required section that no config or option gave.
_REQUIRED = re.compile(r"Option '(\w+)\.([\w.]+)' is required but not provided")

#: The full config suggested when an overlay names none and has no ``base.yaml`` beside it.
DEFAULT_BASE = "configs/quickstart.yaml"


def config_files(argv: Sequence[str]) -> list[str]:
    """The ``--config`` values of a command line, in order."""
    files, args = [], list(argv)
    for i, arg in enumerate(args):
        if arg == "--config" and i + 1 < len(args):
            files.append(args[i + 1])
        elif arg.startswith("--config="):
            files.append(arg.split("=", 1)[1])
    return files


def overlay_error(message: str, argv: Sequence[str]) -> str | None:
    """One line for a required key (``data``, ``model.teachers``...) that none of the
    ``--config`` files of ``argv`` sets, naming them as overlays and the full config to stack
    them on; ``None`` when ``message`` is no such error or a given config sets the key."""
    required = _REQUIRED.search(message)
    files = [f for f in config_files(argv) if Path(f).is_file()]
    if required is None or not files:
        return None
    command, key = required.groups()
    loaded = {f: _load(Path(f)) for f in files}
    if any(_sets(config, key.split(".")) for config in loaded.values()):
        return None
    overlay = files[-1]
    sets = ", ".join(sorted(loaded[overlay])) or "nothing"
    base = _base_of(Path(overlay))
    stacked = " ".join(f"--config {f}" for f in [base, *files])
    return (
        f"{command}.{key}: no --config sets {key}: {overlay} is an overlay (it sets {sets}) "
        f"to stack on a full config: radio-lit {command} {stacked}"
    )


def _load(path: Path) -> dict:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _sets(config: object, keys: list[str]) -> bool:
    """Whether the nested mapping ``config`` has the key path ``keys``."""
    for key in keys:
        if not isinstance(config, dict) or key not in config:
            return False
        config = config[key]
    return True


def _base_of(overlay: Path) -> str:
    """The full config ``overlay``'s comments stack it on (when that file exists), else a
    ``base.yaml`` beside it, else :data:`DEFAULT_BASE`."""
    usage = re.compile(r"--config\s+(\S+)\s+--config\s+\S*" + re.escape(overlay.name))
    for line in overlay.read_text(encoding="utf-8").splitlines():
        found = usage.search(line) if line.lstrip().startswith("#") else None
        if found is not None and Path(found.group(1)).is_file():
            return found.group(1)
    sibling = overlay.parent / "base.yaml"
    if sibling.is_file() and sibling.resolve() != overlay.resolve():
        return str(sibling)
    return DEFAULT_BASE
