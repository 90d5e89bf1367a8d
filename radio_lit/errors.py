"""Errors a user can act on, and how ``radio-lit`` reports them.

A user error (a bad config value, a missing file, an unknown model name, an unsupported size)
is found while the configured classes are built and printed by ``radio-lit`` as one short
message that names the config key and the fix, exit code 2, no traceback. A run stopped by a
training fault (a non-finite loss or gradient) is printed the same way, exit code 1. Set
``RADIO_LIT_TRACEBACK=1`` to see the full traceback as well.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Iterator, Mapping
from types import TracebackType
from typing import Any

#: Environment variable that makes ``radio-lit`` print full tracebacks.
TRACEBACK_ENV = "RADIO_LIT_TRACEBACK"

#: Exit code of a user error (as argparse uses for bad arguments).
USER_ERROR_EXIT = 2


class RadioLitError(Exception):
    """An error ``radio-lit`` prints as one message; ``exit_code`` is the command's status."""

    exit_code = 1


class ConfigError(RadioLitError):
    """A configured value cannot be used: the message names the config key and the fix."""

    exit_code = USER_ERROR_EXIT


class TrainingStopped(RadioLitError):
    """A run stopped on purpose (e.g. a non-finite loss), with the reason."""

    exit_code = 1


def config_error(error: BaseException, config: Mapping[str, Any] | None) -> ConfigError:
    """``error`` raised while building the configured classes, as a :class:`ConfigError`.

    The message is prefixed with the config key of the class whose constructor raised it
    (found from the traceback and the ``class_path`` entries of ``config``), unless the
    message already names a config key.
    """
    message = short_message(error)
    key = _failing_key(error, config) if config is not None else None
    if key is not None and not message.startswith(key):
        message = f"{key}: {message}"
    return ConfigError(message)


def short_message(error: BaseException) -> str:
    """``error``'s message without jsonargparse's union-type preamble.

    jsonargparse reports a failed ``class_path`` value as "Does not validate against any of
    the Union subtypes", one line per subtype, then the given value; only the real reasons
    (not "Expected a <class 'NoneType'>") are kept.
    """
    message = str(error) or type(error).__name__
    if not message.startswith("Does not validate against any of the Union subtypes"):
        return message
    _, _, listed = message.partition("\nErrors:\n")
    reasons = []
    for line in listed.splitlines():
        if not line.startswith("  "):
            break
        reason = line.strip().removeprefix("- ")
        if reason and not reason.startswith("Expected a <class 'NoneType'>"):
            reasons.append(reason)
    return "\n".join(reasons) or message


def _failing_key(error: BaseException, config: Mapping[str, Any]) -> str | None:
    """Config key of the innermost configured class whose ``__init__`` is in the traceback."""
    entries = list(_class_entries(config, ""))
    frames = list(_frames(error.__traceback__))
    for frame in reversed(frames):  # innermost first
        if frame.f_code.co_name != "__init__" or "self" not in frame.f_locals:
            continue
        cls = type(frame.f_locals["self"])
        matches = [
            (key, init) for key, path, init in entries if path.rsplit(".", 1)[-1] == cls.__name__
        ]
        if len(matches) > 1:  # several instances of one class: the one with these arguments
            matches = [
                (key, init)
                for key, init in matches
                if all(frame.f_locals.get(k, v) == v for k, v in init.items())
            ] or matches
        if matches:
            return " / ".join(key for key, _ in matches)
    return None


def _frames(tb: TracebackType | None) -> Iterator[Any]:
    while tb is not None:
        yield tb.tb_frame
        tb = tb.tb_next


def _class_entries(node: Any, prefix: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """``(key, class_path, init_args)`` of every ``class_path`` entry under ``node``."""
    items = node.items() if hasattr(node, "items") else ()
    for name, value in items:
        key = f"{prefix}.{name}" if prefix else str(name)
        if hasattr(value, "items"):
            path = value.get("class_path") if hasattr(value, "get") else None
            if isinstance(path, str):
                init = value.get("init_args") or {}
                yield key, path, dict(init.items()) if hasattr(init, "items") else {}
            yield from _class_entries(value, key)


#: How torch's ``Module.load_state_dict`` starts the message of a checkpoint that does not fit.
_STATE_DICT_MISMATCH = "Error(s) in loading state_dict"


def checkpoint_mismatch(error: BaseException) -> ConfigError | None:
    """A checkpoint that does not fit the configured model (``--ckpt_path``), from torch's
    ``load_state_dict`` error, as one line with its first reason; ``None`` for other errors."""
    lines = str(error).splitlines()
    if not isinstance(error, RuntimeError) or not lines[0].startswith(_STATE_DICT_MISMATCH):
        return None
    reason = next((line.strip() for line in lines[1:] if line.strip()), "")
    return ConfigError(
        f"--ckpt_path: the checkpoint does not fit the configured model: {reason[:400]} "
        "(resume with the config of the run that wrote it)"
    )


def report(error: BaseException, exit_code: int) -> int:
    """Print ``error`` as ``radio-lit: error: …`` (and its traceback if asked); return the code."""
    if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
        traceback.print_exception(error)
    else:
        hint = f"(set {TRACEBACK_ENV}=1 for the traceback)"
        sys.stderr.write(f"radio-lit: error: {error}\n{hint}\n")
    return exit_code
