"""Overlay configs: a YAML that sets part of a run, meant to be stacked on a full config.

``configs/quickstart-eradio.yaml`` (a student), ``configs/ablations/<row>.yaml`` (a
normalizer / loss / balancer) and ``callbacks/*.yaml`` (callbacks) set no ``data``: given alone,
``radio-lit fit --config OVERLAY`` fails in jsonargparse with "Option 'fit.data' is required".
:func:`overlay_error` turns that into one line saying the config is an overlay and which full
config to put before it: the one its own comments show (``radio-lit fit --config BASE --config
OVERLAY``), else a ``base.yaml`` beside it (the ablation rows' layout), else a shipped one.

A later config merges into the mappings keyed by name that an earlier one set
(``model.teachers``, ``model.partitions``, the per-teacher options such as
``model.feature_weights``, and any mapping inside a class's settings such as a teacher's
``model_kwargs``), as a command-line flag ``--model.teachers.dino.init_args.…`` does:
:func:`merged_mapping` keeps the entries the later config does not name, and an entry set to
``null`` removes it (a JSON merge patch, RFC 7386). [choice] jsonargparse replaces a whole
dict-typed value with each config that gives it; radio-lit's run parser merges instead.
"""

from __future__ import annotations

import re
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import yaml
from jsonargparse import Namespace

from radio_lit.core.errors import nested_value_error

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


def wrong_value_line(message: str, argv: Sequence[str]) -> str | None:
    """One line for a wrong value inside a class's settings
    (:func:`~radio_lit.core.errors.nested_value_error`): its full key, the value and what was
    expected, e.g. ``data.init_args.batch_size: expected int, got 'eight'``. A mapping's entry
    (``model.teachers.<name>``) is named from the flag or the ``--config`` that set the value."""
    nested = nested_value_error(message)
    if nested is None:
        return None
    keys, reason, value, class_path = nested
    if None in keys:
        at = keys.index(None)
        name = _entry_setting(keys[:at], keys[at + 2 :], value, argv)
        keys[at] = name or f"<the {str(class_path).rsplit('.', 1)[-1]} entry>"
    got = "" if value is None else f", got {value!r}"
    return f"{'.'.join(keys)}: {reason}{got}"


def _entry_setting(
    mapping: list[str], setting: list[str], value: str | None, argv: Sequence[str]
) -> str | None:
    """The name of the entry of the mapping at key ``mapping`` (``model.teachers``) whose
    ``setting`` (``resolution``) a flag of ``argv``, else one of its ``--config`` files, sets
    (to ``value``, for a config)."""
    prefix, inner = ".".join(mapping), re.escape(".".join(setting))
    flag = re.compile(rf"--{re.escape(prefix)}\.(\w+)\.(?:init_args\.)?{inner}(?:=.*)?")
    for arg in reversed(list(argv)):
        found = flag.fullmatch(arg)
        if found is not None:
            return found.group(1)
    for path in reversed(config_files(argv)):
        entries: Any = _load(Path(path)) if Path(path).is_file() else _inline(path)
        for key in mapping:
            entries = entries.get(key) if isinstance(entries, dict) else None
        for name, entry in (entries or {}).items() if isinstance(entries, dict) else ():
            settings = entry.get("init_args", entry) if isinstance(entry, dict) else None
            for key in setting:
                settings = settings.get(key) if isinstance(settings, dict) else None
            if settings is not None and (value is None or str(settings) == value):
                return str(name)
    return None


def mapping_option(typehint: Any) -> bool:
    """Whether an option of type ``typehint`` is a mapping keyed by name (``dict[str, X]``,
    optionally ``| None``)."""
    if get_origin(typehint) in (Union, types.UnionType):
        return any(mapping_option(t) for t in get_args(typehint) if t is not type(None))
    origin = get_origin(typehint) or typehint
    return isinstance(origin, type) and issubclass(origin, Mapping)


def merged_mapping(value: Any, previous: Any) -> Any:
    """``value``, a mapping a config (or a whole-mapping flag) gives, merged into the
    ``previous`` one (an earlier config's): entries of ``previous`` it does not name are kept,
    the ones it names are its own (merged further by jsonargparse, as a flag's are), and an
    entry set to ``None`` is removed. Anything else is returned as it is."""
    if not isinstance(value, dict) or isinstance(value, Namespace):
        return value
    merged = dict(previous) if isinstance(previous, dict) else {}
    for key, entry in value.items():
        if entry is None:
            merged.pop(key, None)
        else:
            merged[key] = entry
    return merged


def _load(path: Path) -> dict:
    try:
        loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _inline(text: str) -> dict:
    """A ``--config`` given as YAML text rather than a file (jsonargparse takes both)."""
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError:
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
