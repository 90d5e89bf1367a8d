"""``radio-lit fit --help``: radio-lit's own options first, on one screen.

LightningCLI's help of ``fit`` (``validate``, ``test``) prints every option of Lightning's
``Trainer`` and every class a typed argument could take (about 3,700 lines), before and around
the few that set a distillation. :func:`short_help` prints the run's options (``--config``,
``--ckpt_path``, ...), then ``DistillationModule``'s (``--model.*``, with their defaults), the
data module, and the names of the ``--trainer.*`` options; ``--help-all`` prints LightningCLI's
full help, and ``--model.student.help CLASS`` (``--data.help CLASS``, ...) one class's
arguments, as before. Both are read from the parser the command builds, so an option added to
``DistillationModule`` lists itself. A mapping of classes keyed by name (``model.teachers``)
gets the same: ``--model.teachers.help radio_lit.teachers.RADIOTeacher`` lists the arguments a
teacher of that class takes, as ``--model.teachers.NAME.init_args.ARG``
(:func:`add_entry_helps`).
"""

from __future__ import annotations

import re
import textwrap
import types
from argparse import SUPPRESS, Action, ArgumentParser
from collections.abc import Mapping
from typing import Any, Union, get_args, get_origin

from jsonargparse._actions import _ActionHelpClassPath

from radio_lit.cli.commands import LIGHTNING_COMMANDS

#: The option that prints LightningCLI's full help (every Trainer option and class).
FULL_HELP = "--help-all"
#: The run's own options (LightningCLI's top-level ones), in the order they are shown.
RUN_OPTIONS = {
    "config": ("-c, --config FILE", "a config (YAML); several are stacked, later ones win"),
    "print_config": ("--print_config", "print the resolved config and exit (builds nothing)"),
    "ckpt_path": ("--ckpt_path CKPT", "resume this checkpoint exactly (its run folder goes on)"),
    "seed_everything": ("--seed_everything SEED", "the run's seed"),
}
#: Width of the help's lines and of its option column.
WIDTH, COLUMN = 92, 34


def wants_short_help(argv: list[str]) -> bool:
    """Whether ``argv`` (``radio-lit``'s arguments) asks for a Lightning command's short help:
    ``fit|validate|test`` with ``-h`` / ``--help`` and without :data:`FULL_HELP`."""
    asks = any(a in ("-h", "--help") for a in argv[1:])
    return bool(argv) and argv[0] in LIGHTNING_COMMANDS and asks and FULL_HELP not in argv


def full_help_argv(argv: list[str]) -> list[str]:
    """``argv`` with :data:`FULL_HELP` given to LightningCLI as its own ``--help``."""
    return ["--help" if a == FULL_HELP else a for a in argv]


def add_entry_helps(parser: ArgumentParser) -> None:
    """Add ``--KEY.help CLASS`` for each option of ``parser`` that is a mapping of classes
    keyed by name (``model.teachers``: ``dict[str, BaseTeacher]``), as jsonargparse adds one
    for a class option (``--model.student.help``); jsonargparse adds none for a mapping (it
    takes ``help`` for the name of an entry)."""
    for action in list(parser._actions):
        entry = _entry_class(getattr(action, "_typehint", None))
        option = f"--{action.dest}.help"
        if entry is not None and option not in parser._option_string_actions:
            parser.add_argument(option, action=_EntryHelp(typehint=entry))


class _EntryHelp(_ActionHelpClassPath):
    """``--model.teachers.help CLASS``: jsonargparse's class help, with each argument named as
    an entry's (``--model.teachers.NAME.init_args.model``)."""

    def print_help(self, call_args: Any) -> None:
        mapping = self.dest.removesuffix(".help")
        self.dest = f"{mapping}.NAME.init_args.help"  # jsonargparse names the arguments by it
        try:
            super().print_help(call_args)
        finally:
            self.dest = f"{mapping}.help"


def _entry_class(typehint: Any) -> Any:
    """``X`` of a ``dict[str, X]`` (optionally ``| None``) whose ``X`` is a class with
    arguments (jsonargparse's class help takes it), else ``None``."""
    if get_origin(typehint) in (Union, types.UnionType):
        found = [_entry_class(t) for t in get_args(typehint) if t is not type(None)]
        return next((t for t in found if t is not None), None)
    origin, arguments = get_origin(typehint), get_args(typehint)
    if not (isinstance(origin, type) and issubclass(origin, Mapping) and len(arguments) == 2):
        return None
    return arguments[1] if _ActionHelpClassPath.get_help_types(arguments[1]) else None


def short_help(parser: ArgumentParser, command: str) -> str:
    """The help of ``radio-lit COMMAND`` (a Lightning command) from its ``parser``."""
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    model = [a for dest, a in actions.items() if _is_model_option(dest, a)]
    trainer = sorted(
        dest.split(".", 1)[1]
        for dest, a in actions.items()
        if dest.startswith("trainer.") and dest.count(".") == 1 and not _is_class_help(a)
    )
    lines = [
        f"usage: radio-lit {command} --config FILE [--config OVERLAY] [--section.key VALUE ...]",
        "",
        f"radio-lit {command}: {LIGHTNING_COMMANDS[command]}",
        "",
        "the run:",
        *(_row(actions[name], *RUN_OPTIONS[name]) for name in RUN_OPTIONS if name in actions),
        "",
        "the distillation (DistillationModule; a class's own arguments: --model.KEY.help CLASS):",
        *(_row(action) for action in model),
        "",
        "the data:",
        _row(actions["data"], "--data CLASS", _DATA_HELP),
        "",
        "Lightning's Trainer (--trainer.KEY VALUE; described by --help-all):",
        textwrap.fill(", ".join(trainer), WIDTH, initial_indent="  ", subsequent_indent="  "),
        "",
        f"radio-lit {command} {FULL_HELP} shows every option with its description, Lightning's "
        "included.",
    ]
    return "\n".join(lines)


_DATA_HELP = (
    "the data module: radio_lit.data.ImageFolderDataModule, WebDatasetDataModule, "
    "SyntheticDataModule or radio_lit.cache.CachedViews; its arguments: --data.help CLASS"
)


def _is_class_help(action: Action) -> bool:
    return action.dest.endswith(".help")


def _is_model_option(dest: str, action: Action) -> bool:
    """A ``DistillationModule`` argument (``model.KEY``, ``model.fsdp2.KEY``), not a config
    file loader or a class help."""
    if not dest.startswith("model.") or _is_class_help(action):
        return False
    return action.help is not None and not action.help.startswith("Path to a configuration")


def _row(action: Action, option: str | None = None, text: str | None = None) -> str:
    """One option: its name and its description (the first sentence of the docstring's,
    without reST markup), its default where it has a short one, wrapped under
    :data:`COLUMN`."""
    if option is None:
        option = f"{max(action.option_strings, key=len)} {_metavar(action)}"
    described = text if text is not None else _first_sentence(_plain(action.help or ""))
    default = action.default
    if action.required:
        described += " (required)"
    elif default not in (None, SUPPRESS) and len(_plain_default(default)) <= 48:
        described += f" (default: {_plain_default(default)})"
    head = f"  {option}"
    indent = " " * COLUMN
    if len(head) >= COLUMN - 1:  # the description starts on the next line
        wrapped = textwrap.wrap(described, WIDTH - COLUMN, break_on_hyphens=False)
        return "\n".join([head, *(indent + line for line in wrapped)])
    return textwrap.fill(
        described,
        WIDTH,
        initial_indent=head.ljust(COLUMN),
        subsequent_indent=indent,
        break_on_hyphens=False,
    )


def _first_sentence(text: str) -> str:
    """``text`` up to its first full stop followed by a space (an abbreviation such as
    "eqs. 1-4" aside: the next word starts with a capital letter or a quote)."""
    found = re.search(r"\.\s+(?=[A-Z\"(])", text)
    return text[: found.start() + 1] if found else text


def _metavar(action: Action) -> str:
    if isinstance(action.metavar, str):
        return action.metavar
    return action.dest.rsplit(".", 1)[-1].upper()


def _plain(text: str) -> str:
    """``text`` without reST roles and literals (``:class:`~a.B``` -> ``B``)."""
    text = re.sub(r":\w+:`~?([\w.]+)`", lambda m: m.group(1).rsplit(".", 1)[-1], text)
    return " ".join(text.replace("``", "").split())


def _plain_default(value: object) -> str:
    if isinstance(value, dict) and "class_path" in value:
        return str(value["class_path"])
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)
