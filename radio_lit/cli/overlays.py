"""Overlay configs: a YAML that sets part of a run, meant to be stacked on a full config.

``configs/quickstart-eradio.yaml`` (a student), ``configs/ablations/<row>.yaml`` (a
normalizer / loss / balancer) and ``callbacks/*.yaml`` (callbacks) set no ``data``: given alone,
``radio-lit fit --config OVERLAY`` fails in jsonargparse with "Option 'fit.data' is required".
:func:`overlay_error` turns that into one line saying the config is an overlay and which full
config to put before it: the one its own comments show (``radio-lit fit --config BASE --config
OVERLAY``), else a ``base.yaml`` beside it (the ablation rows' layout), else a shipped one.

A later config merges into what the earlier ones set, by one rule for every mapping at every
depth: the mappings keyed by name (``model.teachers``, ``model.partitions``, the per-teacher
options such as ``model.feature_weights``) and any mapping inside a class's settings, typed or
``dict[str, Any]`` (a teacher's ``model_kwargs``, OpenCLIP's ``model_cfg.vision_cfg``, SAM3's
``model_kwargs.backbone_config``). :func:`merged_mapping` is a JSON merge patch (RFC 7396): the
entries the later config does not name are kept, a mapping entry merges into the earlier one,
any other value replaces it, and ``null`` removes an entry. [choice] Two departures, so that a
merge never loses what a config says: ``null`` removes only what came before (an earlier
config's entry); in a config's own values, where nothing came before (the first config, or a key
no earlier config gave), ``null`` is the value ``None`` passed to the class; and a class value
(``class_path`` / ``init_args``: a teacher, the data, a normalizer) whose ``class_path`` changes
starts fresh, with only the later config's ``init_args`` and the new class's defaults
(:func:`stacked_value`, :func:`restarted_classes`; jsonargparse would keep every earlier
argument the new class also accepts), said in one line of the log. [choice] jsonargparse
replaces a whole dict-typed value with each config that gives it and keeps a replaced class's
arguments; radio-lit's run parser merges and starts fresh instead.
"""

from __future__ import annotations

import contextvars
import importlib
import inspect
import re
import types
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Union, get_args, get_origin

import yaml
from jsonargparse import Namespace, _typehints
from lightning.pytorch.utilities import rank_zero_info

from radio_lit.core.errors import did_you_mean, nested_value_error, unaccepted_argument

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
    expected, e.g. ``data.init_args.batch_size: expected int, got 'eight'``; or for an
    argument the class does not take (:func:`~radio_lit.core.errors.unaccepted_argument`):
    its full key and the closest argument it takes, e.g. ``model.teachers.dino.init_args.modl:
    DINOv2Teacher takes no argument 'modl' (did you mean 'model'?)``. A mapping's entry
    (``model.teachers.<name>``) is named from the flag or the ``--config`` that set the value."""
    unaccepted = unaccepted_argument(message)
    if unaccepted is not None:
        keys, argument, class_path = unaccepted
        _name_entry(keys, argument.split("."), None, argv, class_path)
        name = class_path.rsplit(".", 1)[-1]
        hint = did_you_mean(argument, _arguments(class_path))
        return f"{'.'.join([*keys, argument])}: {name} takes no argument {argument!r}{hint}"
    nested = nested_value_error(message)
    if nested is None:
        return None
    keys, reason, value, class_path = nested
    _name_entry(keys, [], value, argv, class_path)
    got = "" if value is None else f", got {value!r}"
    return f"{'.'.join(keys)}: {reason}{got}"


def _name_entry(
    keys: list[Any], setting: list[str], value: str | None, argv: Sequence[str], class_path: Any
) -> None:
    """Put the entry's name in place of the ``None`` in ``keys`` (``model.teachers.<name>``):
    the entry whose setting (the keys after the name, then ``setting``) a flag or config of
    ``argv`` sets (to ``value``, when given)."""
    if None not in keys:
        return
    at = keys.index(None)
    name = _entry_setting(keys[:at], [*keys[at + 2 :], *setting], value, argv)
    keys[at] = name or f"<the {str(class_path).rsplit('.', 1)[-1]} entry>"


def _arguments(class_path: str) -> list[str]:
    """The keyword arguments of the class ``class_path`` names (none when it does not import)."""
    found = _imported(class_path)
    try:
        parameters = inspect.signature(found).parameters.values() if callable(found) else []
    except (TypeError, ValueError):
        return []
    return [p.name for p in parameters if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


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


#: Whether the parser is validating a parsed config (``ArgumentParser.validate``): each value is
#: then checked against itself, not stacked on an earlier one.
VALIDATING: contextvars.ContextVar[bool] = contextvars.ContextVar("validating", default=False)
#: jsonargparse's flag for its pass that applies a parsed config onto itself to add the classes'
#: defaults (``ActionTypeHint.add_sub_defaults``): nothing is stacked then either.
_SUB_DEFAULTS: contextvars.ContextVar[bool] | None = getattr(_typehints, "sub_defaults", None)


def stacked_value(
    action: Any, value: Any, key: str, cfg: Namespace | None
) -> tuple[Any, Namespace | None]:
    """``value``, which a config gives for ``key``, stacked on what ``cfg`` (the earlier
    configs, and the defaults) holds there: ``(value, cfg)`` to check it with.

    - A mapping (:func:`mapping_option`) is :func:`merged_mapping` into the earlier one.
    - A class value whose ``class_path`` is another class than the earlier one's (an entry of
      a mapping of classes, ``model.teachers.dino``, or a class option, ``data``) starts
      fresh: ``cfg`` is returned without the earlier value, so that jsonargparse merges the
      given ``init_args`` into the new class's defaults only; one line says so.

    Anything else is returned as it is, and every value while the parser checks a parsed
    config against itself (:data:`VALIDATING`, jsonargparse's pass that adds the defaults)."""
    if cfg is None or VALIDATING.get() or (_SUB_DEFAULTS is not None and _SUB_DEFAULTS.get()):
        return value, cfg
    previous = cfg.get(key)
    if isinstance(value, dict) and mapping_option(getattr(action, "_typehint", None)):
        value = merged_mapping(value, previous)
        earlier = previous if isinstance(previous, dict) else {}
        restarted = [n for n, entry in value.items() if _other_class(entry, earlier.get(n))]
        for name in restarted:
            _say_restarted(f"{key}.{name}", earlier[name], value[name])
        if restarted:
            cfg = cfg.clone()
            cfg[key] = {n: entry for n, entry in earlier.items() if n not in restarted}
    elif _other_class(value, previous):
        _say_restarted(key, previous, value)
        cfg = cfg.clone()
        cfg[key] = None
    return value, cfg


def restarted_classes(later: Namespace, earlier: Namespace) -> list[str]:
    """The keys of the class values (``data``, ``model.student``...) that the config ``later``
    gives with another class than ``earlier`` holds: jsonargparse merges a config into the
    earlier ones key by key, which would keep the earlier class's settings that the later
    value does not set; these are replaced whole instead (:func:`stacked_value`)."""
    keys = [k for k in later.keys(branches=True) if _other_class(later.get(k), earlier.get(k))]
    return [k for k in keys if not any(k.startswith(f"{o}.") for o in keys)]  # outermost


def merged_mapping(value: Any, previous: Any) -> Any:
    """``value``, a mapping a config (or a whole-mapping flag) gives, merged into the
    ``previous`` one (an earlier config's) as a JSON merge patch (RFC 7396), at every depth:
    entries of ``previous`` it does not name are kept; an entry that is a mapping where
    ``previous`` has a mapping is merged into it; a class value (``class_path`` /
    ``init_args``) is its own (jsonargparse merges its ``init_args`` into the earlier
    entry's, as a flag's); any other entry replaces the earlier one. An entry set to ``None``
    removes the earlier entry, and where ``previous`` has none is kept as ``None`` (the value
    a config gives a keyword argument). Anything else is returned as it is.

    >>> merged_mapping({"vision_cfg": {"layers": 3}, "quick_gelu": None, "init_logit_bias": None},
    ...                {"quick_gelu": True, "vision_cfg": {"layers": 2, "width": 64}})
    {'vision_cfg': {'layers': 3, 'width': 64}, 'init_logit_bias': None}
    """
    if not isinstance(value, dict) or isinstance(value, Namespace):
        return value
    if not isinstance(previous, dict):
        return value
    merged = dict(previous)
    for key, entry in value.items():
        if entry is None and key in merged:
            merged.pop(key)
        elif (
            isinstance(entry, dict)
            and isinstance(merged.get(key), dict)
            and not _other_class(entry, merged[key])
        ):
            merged[key] = merged_mapping(entry, merged[key])
        else:
            merged[key] = entry
    return merged


def _other_class(value: Any, previous: Any) -> bool:
    """Whether ``value`` is a class value (a mapping with ``class_path``, or a class's dotted
    path) naming another class than the class value ``previous`` that had settings (short and
    full names of one class are the same)."""
    given, earlier = _class_path(value), _class_path(previous)
    if given is None or earlier is None or not isinstance(previous, (dict, Namespace)):
        return False
    if not previous.get("init_args"):  # nothing to keep or drop
        return False
    return not _same_class(given, earlier)


def _same_class(given: str, earlier: str) -> bool:
    """Whether two class paths name one class, each given short (``DINOv2Teacher``, which
    jsonargparse resolves by its last part among the classes the option admits) or full (or by
    an old alias, ``radio_lit/_aliases.py``): two paths that import compare as classes, a
    short name by the name of the class the other one names."""
    one, other = _imported(given), _imported(earlier)
    if inspect.isclass(one) and inspect.isclass(other):
        return one is other
    return _class_name(given) == _class_name(earlier)


def _class_name(class_path: str) -> str:
    """The name of the class ``class_path`` names (an alias imports to its class)."""
    found = _imported(class_path)
    return found.__name__ if inspect.isclass(found) else class_path.rpartition(".")[2]


def _class_path(value: Any) -> str | None:
    """The class path of a class value: a mapping's ``class_path``, or a string naming a
    class; else ``None``."""
    if isinstance(value, (dict, Namespace)):
        found = value.get("class_path")
        return str(found) if found else None
    if isinstance(value, str) and inspect.isclass(_imported(value)):
        return value
    return None


def _imported(class_path: str) -> Any:
    """The object ``class_path`` names, else the string itself (a name jsonargparse resolves
    by its last part, or one that does not import: jsonargparse reports it)."""
    module, _, name = class_path.rpartition(".")
    try:
        return getattr(importlib.import_module(module), name) if module else class_path
    except (ImportError, AttributeError, ValueError):
        return class_path


def _say_restarted(key: str, earlier: Any, given: Any) -> None:
    """The line of the log for a class value that starts fresh (on standard error)."""
    old, new = _class_path(earlier), _class_path(given)
    rank_zero_info(
        f"config: {key}: class_path {old} -> {new}: starts fresh, from the given init_args "
        f"and {str(new).rsplit('.', 1)[-1]}'s defaults (the earlier init_args are dropped)"
    )


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
