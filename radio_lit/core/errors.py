"""Errors a user can act on, and how ``radio-lit`` reports them.

A user error (a bad config value, a missing file, an unknown model name, an unsupported size)
is found while the configured classes are built and printed by ``radio-lit`` as one short
message that names the config key and the fix, exit code 2, no traceback. A run stopped by a
training fault (a non-finite loss or gradient) is printed the same way, exit code 1 (a run
whose update trained nothing: exit code 2, :class:`NoTrainingProgress`). Set
``RADIO_LIT_TRACEBACK=1`` to see the full traceback as well.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import re
import signal
import sys
import traceback
import zipfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    import torch

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


class NoTrainingProgress(TrainingStopped):
    """A run whose update trained nothing (:class:`radio_lit.callbacks.TrainingProgressGuard`):
    most often a setting (a learning rate of 0) or code that cuts the student from the graph,
    so the exit code is a user error's; what the run saved before is kept."""

    exit_code = USER_ERROR_EXIT


class Preempted(RadioLitError):
    """A run stopped by a signal at a step boundary, after every rank took part in saving a
    checkpoint (:class:`radio_lit.callbacks.Preemption`, which has said where it is and how the
    run goes on). The exit code is the shell's for the signal (128 + its number: 143 for
    SIGTERM, 130 for Ctrl-C), so that a chained ``radio-lit fit … && next-stage`` stops."""

    def __init__(self, signum: int) -> None:
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name}")


class BuildInterrupted(BaseException):
    """A stop signal (Ctrl-C, ``SIGTERM``, SLURM's ``USR1``) that arrived while ``radio-lit
    fit`` was still building its run, raised from the signal handler
    (:class:`radio_lit.distributed.cluster.StopSignals`) so that a build of minutes stops at once:
    nothing
    was trained, nothing needs saving (:func:`radio_lit.distributed.cluster.stop_building` requeues
    a
    SLURM job). A ``BaseException``, as ``KeyboardInterrupt`` is, so that code that turns a
    constructor's ``Exception`` into a :class:`ConfigError` lets it through. The exit code is
    the shell's for the signal, 128 + its number."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.exit_code = 128 + signum
        super().__init__(f"stopped by {signal.Signals(signum).name} while the run was built")


def interruption(error: BaseException) -> BuildInterrupted | None:
    """The :class:`BuildInterrupted` that ``error`` is, or that it was raised from or while
    handling: a signal that lands while Python creates a class (``cached_property``'s
    ``__set_name__``, say, in the middle of an import) comes back wrapped in a
    ``RuntimeError``."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, BuildInterrupted):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


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


#: jsonargparse's lines about the value types that were not meant.
_NOT_REASONS = ("- Expected a path but", "- Expected a <class 'NoneType'>")


def short_message(error: BaseException) -> str:
    """``error``'s message without jsonargparse's union-type preamble.

    jsonargparse reports a failed ``class_path`` value as "Does not validate against any of
    the Union subtypes", one line per subtype, then the given value; only the real reasons
    (not "Expected a <class 'NoneType'>") are kept. A value that is neither a path nor a
    class reads ``Parser key "k": - Expected a path ... - Type ... : reason``; it becomes
    ``k: reason``. A callback whose constructor refused its arguments keeps that reason
    without the accepted forms of a ``Callback`` listed after it.
    """
    message = str(error) or type(error).__name__
    keyed = re.match(r'Parser key "([\w.]+)":\s*\n', message)
    if keyed is not None:
        reasons = [
            line.strip().removeprefix("- ")
            for line in message[keyed.end() :].splitlines()
            if line.strip().startswith("- ") and not line.strip().startswith(_NOT_REASONS)
        ]
        if reasons:
            return f"{keyed.group(1)}: " + "; ".join(reasons)
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
    # A callback constructor's own reason, then jsonargparse's list of accepted forms.
    return ("\n".join(reasons) or message).split("\nNot a valid subclass of ", 1)[0]


#: A line of jsonargparse's nested report: a key, a class value, the value given.
_KEY_LINE = re.compile(r'^(\s*)(?:- )?Parser key "([\w.]+)":\s*$')
_CLASS_LINE = re.compile(r"^(\s*)(?:- )?Problem with given class_path '([\w.]+)':\s*$")
_VALUE_LINE = re.compile(r"^\s*Given value: (.*)$")
_GOT_VALUE = re.compile(r"^(.*?)\.? Got value: (.*)$")
_NOT_A_REASON = ("Does not validate", "Subtypes:", "Errors:", "Given value", "Problem with")


def nested_value_error(message: str) -> tuple[list[str], str, str | None, str | None] | None:
    """A wrong value inside a class's settings, from jsonargparse's nested report (``Parser
    key "data": ... Problem with given class_path '...': Parser key "batch_size": Expected a
    <class 'int'>. Got value: eight``): ``(keys, reason, value, class_path)``, the keys from
    the outermost (``["data", "init_args", "batch_size"]``), ``None`` where a mapping's entry
    name stands (``model.teachers.<name>``: the report does not say which) and ``class_path``
    the class whose setting it is. ``None`` when ``message`` is no such report."""
    lines = message.splitlines()
    chain = _chain(lines)
    if len(chain) < 3 or chain[-1][1].startswith("class:"):
        return None
    keys, class_path = _chain_keys(chain)
    deepest = max(i for i, line in enumerate(lines) if _KEY_LINE.match(line))
    indent = chain[-1][0]
    reasons, value = [], None
    for line in lines[deepest + 1 :]:
        if len(line) - len(line.lstrip()) <= indent:
            break
        text = line.strip().removeprefix("- ")
        given = _VALUE_LINE.match(line)
        if given is not None:
            value = given.group(1) if value is None else value
        elif (
            text
            and not text.startswith(_NOT_A_REASON)
            and not line.strip().startswith(_NOT_REASONS)
        ):
            got = _GOT_VALUE.match(text)
            if got is not None:
                text, value = got.group(1), got.group(2)
            reasons.append(text)
    if not reasons:
        return None
    reason = re.sub(r"Expected an? <class '([\w.]+)'>", r"expected \1", "; ".join(reasons))
    return keys, reason, value, class_path  # type: ignore[return-value]


#: The mappings of classes keyed by name, whose entry a nested report does not name.
_MAPPINGS = ("teachers", "partitions", "normalizer_overrides", "grid_policy_overrides")

#: jsonargparse's line for an argument that a class does not take.
_UNACCEPTED = re.compile(r"^(\s*)(?:- )?Option '([\w.]+)' is not accepted\s*$")


def unaccepted_argument(message: str) -> tuple[list[str | None], str, str] | None:
    """An argument a class does not take, from jsonargparse's nested report (``Parser key
    "model.teachers": Problem with given class_path 'radio_lit.teachers.DINOv2Teacher':
    Option 'modl' is not accepted``): ``(keys, argument, class_path)``, the keys of the
    class's ``init_args`` from the outermost (``["model", "teachers", None, "init_args"]``,
    ``None`` where a mapping's entry name stands, as in :func:`nested_value_error`).
    ``None`` when ``message`` is no such report."""
    lines = message.splitlines()
    at = next((i for i, line in enumerate(lines) if _UNACCEPTED.match(line)), None)
    if at is None:
        return None
    indent = len(_UNACCEPTED.match(lines[at]).group(1))  # type: ignore[union-attr]
    chain = [link for link in _chain(lines[:at]) if link[0] < indent]
    if not chain or not chain[-1][1].startswith("class:"):
        return None
    keys, class_path = _chain_keys(chain)
    return keys, _UNACCEPTED.match(lines[at]).group(2), str(class_path)  # type: ignore[union-attr]


def _chain(lines: list[str]) -> list[tuple[int, str]]:
    """The keys and class paths of jsonargparse's nested report that lead to its last line:
    ``(indent, key)`` or ``(indent, "class:" + class path)``, outermost first."""
    chain: list[tuple[int, str]] = []
    for line in lines:
        found = _KEY_LINE.match(line) or _CLASS_LINE.match(line)
        if found is None:
            continue
        indent = len(found.group(1))
        while chain and chain[-1][0] >= indent:
            chain.pop()
        chain.append((indent, ("class:" if found.re is _CLASS_LINE else "") + found.group(2)))
    return chain


def _chain_keys(chain: list[tuple[int, str]]) -> tuple[list[str | None], str | None]:
    """The config keys of a :func:`_chain` (a class's ``init_args``; ``None`` for a mapping's
    entry name) and the innermost class path."""
    keys: list[str | None] = []
    class_path = None
    for _, part in chain:
        if part.startswith("class:"):
            class_path = part.removeprefix("class:")
            # a class given directly (data) or as one entry of a mapping (model.teachers.dino)
            keys.extend([None, "init_args"] if keys and keys[-1] in _MAPPINGS else ["init_args"])
        else:
            keys.extend(part.split("."))
    return keys, class_path


def checkpoint_file(path: str | os.PathLike[str], option: str) -> Path:
    """``path`` checked as a readable training checkpoint, else a :class:`ConfigError`.

    A missing file, a folder (other than a sharded checkpoint: ``torch.distributed.checkpoint``
    shards with their ``.metadata``), or a file that is not a ``torch.save`` archive
    (truncated, random bytes) is refused before anything is built, with the option that gave
    it.

    Args:
        path: the checkpoint file.
        option: the command-line option or config key that named it, e.g. ``"--ckpt_path"``.
    """
    file = Path(path).expanduser()
    if file.is_dir() and (file / ".metadata").is_file():  # a sharded checkpoint folder
        return file
    if not file.is_file():
        raise ConfigError(
            f"{option}: checkpoint {file} does not exist; give a .ckpt written by radio-lit fit "
            "(e.g. lightning_logs/<run>/version_0/checkpoints/last.ckpt)"
        )
    if not zipfile.is_zipfile(file):
        raise ConfigError(
            f"{option}: {file} cannot be read as a checkpoint (not a torch.save archive: "
            "truncated or another kind of file); give a .ckpt written by radio-lit fit"
        )
    return file


def device_option(value: str, option: str = "--device") -> torch.device:
    """``value`` as a ``torch.device`` this machine has, else a :class:`ConfigError` naming
    ``option``: a name torch cannot read (``gpu``), a CUDA device where none is visible, or an
    index beyond the visible ones."""
    import torch

    try:
        device = torch.device(value)
    except RuntimeError as error:
        raise ConfigError(f"{option} {value!r}: not a device; give cpu, cuda or cuda:N") from error
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if count == 0:
            raise ConfigError(f"{option} {value}: no CUDA device is visible here; give cpu")
        if device.index is not None and device.index >= count:
            raise ConfigError(
                f"{option} {value}: {count} CUDA device(s) visible here, cuda:0 to cuda:{count - 1}"
            )
    return device


def did_you_mean(name: str, known: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` for the known names closest to ``name``, else ``""``.

    Letter case is ignored when comparing, so ``PHIS`` finds ``PhiS``.
    """
    by_lower: dict[str, str] = {}
    for candidate in known:
        by_lower.setdefault(candidate.lower(), candidate)
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=2, cutoff=0.6)
    if not close:
        return ""
    return " (did you mean " + " or ".join(repr(by_lower[c]) for c in close) + "?)"


#: jsonargparse's message for a class path whose last name the module lacks.
_MISSING_ATTRIBUTE = re.compile(r"module '([\w.]+)' has no attribute '(\w+)'")


def with_suggestions(message: str, options: Iterable[str] = ()) -> str:
    """``message`` with a "did you mean" for an unknown option or class name in it.

    - ``Unrecognized arguments: --model.normalzer X`` -> the closest of ``options``;
    - ``module 'radio_lit.normalizers' has no attribute 'PHIS'`` -> the closest public name
      of that module (``PhiS``).
    """
    unknown = re.match(r"(?:Unrecognized|unrecognized) arguments: (--[\w.\-]+)", message)
    if unknown is not None:
        given = unknown.group(1)
        known = [o for o in options if o.startswith("--") and not o.endswith(".help")]
        return message + did_you_mean(given, known)
    missing = _MISSING_ATTRIBUTE.search(message)
    if missing is not None:
        module_name, attribute = missing.groups()
        try:
            module = importlib.import_module(module_name)
            names = [n for n, v in vars(module).items() if n[:1] != "_" and callable(v)]
        except ImportError:
            return message
        hint = did_you_mean(attribute, names)
        if hint:
            # The suggestion goes after the first line that names the missing attribute.
            lines = message.splitlines()
            at = next(i for i, line in enumerate(lines) if missing.group(0) in line)
            lines[at] = lines[at].replace(missing.group(0), missing.group(0) + hint, 1)
            return "\n".join(lines)
    return message


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


def checkpoint_mismatch(
    error: BaseException, ckpt_path: str | os.PathLike[str] | None = None
) -> ConfigError | None:
    """A checkpoint that does not fit the configured model (``--ckpt_path``), from torch's
    ``load_state_dict`` error, as one line with its first reason (a list of keys shortened to
    three and their count); ``None`` for other errors. The advice names the ``config.yaml``
    of the run that wrote ``ckpt_path`` when it is beside its ``checkpoints/`` folder."""
    lines = str(error).splitlines()
    if not isinstance(error, RuntimeError) or not lines[0].startswith(_STATE_DICT_MISMATCH):
        return None
    reason = next((line.strip() for line in lines[1:] if line.strip()), "")
    keys = re.match(r"([^:]+: )((?:\"[^\"]*\"(?:, )?)+)\.?$", reason)
    if keys is not None:
        names = re.findall(r'"([^"]*)"', keys.group(2))
        shown = ", ".join(names[:3]) + (f", ... ({len(names)} keys)" if len(names) > 3 else "")
        reason = keys.group(1) + shown
    advice = "resume with the config of the run that wrote it"
    folder = Path(ckpt_path).parent if ckpt_path else None
    if (
        folder is not None
        and folder.name == "checkpoints"
        and (folder.parent / "config.yaml").is_file()
    ):
        advice += (
            f": radio-lit fit --config {folder.parent / 'config.yaml'} --ckpt_path {ckpt_path}"
        )
    return ConfigError(
        f"--ckpt_path: the checkpoint does not fit the configured model: {reason[:400]} ({advice})"
    )


#: What gloo and NCCL say when another rank of the group is gone.
_PEER_LOST = (
    "Connection reset by peer",
    "Connection closed by peer",
    "Broken pipe",
    "remote process exited",
    "ncclRemoteError",
)


def lost_rank(error: BaseException, rank: int, world_size: int) -> TrainingStopped | None:
    """A collective that failed because another rank died (killed, out of memory, its node
    lost), as one line for rank ``rank``; ``None`` for other errors. The launcher names the
    rank that died (``srun --kill-on-bad-exit=1``: ``task N: Killed``; torchrun: its root
    cause table)."""
    text = str(error)
    if not isinstance(error, RuntimeError) or not any(m in text for m in _PEER_LOST):
        return None
    reason = re.sub(r"^\[[^\]]*\]\s*", "", text.splitlines()[0]).split(". This is")[0]
    return TrainingStopped(
        f"rank {rank} of {world_size}: another rank of this run stopped ({reason[:200]}); "
        "the launcher's log names it (srun: 'task N', torchrun: 'Root Cause'); resume from "
        "the run's last checkpoint with --ckpt_path"
    )


def report(error: BaseException, exit_code: int) -> int:
    """Print ``error`` as ``radio-lit: error: …`` (and its traceback if asked); return the code."""
    if os.environ.get(TRACEBACK_ENV, "") not in ("", "0"):
        traceback.print_exception(error)
    else:
        hint = f"(set {TRACEBACK_ENV}=1 for the traceback)"
        sys.stderr.write(f"radio-lit: error: {error}\n{hint}\n")
    return exit_code


#: The first names of a run's options (``radio-lit fit``'s), which a subcommand's overrides
#: (:meth:`CommandParser.parse_with_overrides`) must start with.
RUN_OPTIONS = (
    "--ckpt_path",
    "--config",
    "--data",
    "--lr_scheduler",
    "--model",
    "--optimizer",
    "--print_config",
    "--seed_everything",
    "--trainer",
    "--weights_only",
)


class CommandParser(argparse.ArgumentParser):
    """``argparse`` parser of a ``radio-lit`` subcommand: a bad argument raises
    :class:`ConfigError` (printed by ``radio-lit`` as one line, exit code 2) and long options
    are never abbreviated."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(**kwargs)

    def error(self, message: str) -> NoReturn:
        known = [o for a in self._actions for o in a.option_strings]
        raise ConfigError(f"{self.prog}: {with_suggestions(message, known)}")

    def parse_with_overrides(self, argv: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
        """The command's own options, and the rest: ``--section.key value`` config overrides
        passed on to the run (anything else is refused)."""
        args, overrides = self.parse_known_args(list(argv))
        if overrides and not overrides[0].startswith("--"):
            self.error(f"unexpected argument {overrides[0]!r}; overrides are --section.key value")
        for at, override in enumerate(overrides):
            key = override.split("=", 1)[0]
            if key.startswith("--") and key.split(".", 1)[0].rstrip("+") not in RUN_OPTIONS:
                value = overrides[at + 1 : at + 2] if "=" not in override else []
                given = " ".join([override, *(v for v in value if not v.startswith("--"))])
                own = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
                message = with_suggestions(f"Unrecognized arguments: {given}", own + [*RUN_OPTIONS])
                raise ConfigError(f"{self.prog}: {message}")
        return args, overrides
