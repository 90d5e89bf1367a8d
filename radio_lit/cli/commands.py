"""``radio-lit --help`` (and a bare ``radio-lit``): every command, one line each.

LightningCLI's own help lists only its subcommands; radio-lit's commands (``predict``,
``evaluate``, ``export``, ``cache``, ``ablate``...) run outside it. Each radio-lit command's
line is the first line of its module's docstring (``"``radio-lit NAME``: what it does."``),
read without importing the module, so a new command lists itself.
"""

from __future__ import annotations

import ast
import importlib.util
import textwrap
from collections.abc import Mapping
from pathlib import Path

#: LightningCLI's subcommands that ``radio-lit`` runs through
#: :class:`~radio_lit.cli.app.RadioLitCLI`.
LIGHTNING_COMMANDS: dict[str, str] = {
    "fit": "train a student: --config FILE [--config overlay.yaml] [--section.key value]",
    "validate": "the validation metrics of --ckpt_path on data.init_args.val_dir",
    "test": "Lightning's test loop over data.init_args.val_dir with --ckpt_path",
}


def command_summary(name: str, target: str) -> str:
    """The summary of the command ``name`` run by ``target`` (``"module:function"``): the first
    paragraph of the module's docstring without its ``radio-lit NAME`` prefix, on one line,
    and the choices of its ``--format`` option, if it has one."""
    spec = importlib.util.find_spec(target.split(":")[0])
    origin = spec.origin if spec is not None else None
    if origin is None:
        return ""
    tree = ast.parse(Path(origin).read_text(encoding="utf-8"))
    docstring = (ast.get_docstring(tree) or "").strip()
    first = " ".join(docstring.split("\n\n", 1)[0].split())
    prefix = f"``radio-lit {name}``:"
    summary = first.removeprefix(prefix).strip().rstrip(".").replace("``", "")
    formats = _format_choices(tree)
    return f"{summary} (--format {'|'.join(formats)})" if formats else summary


def _format_choices(tree: ast.Module) -> list[str]:
    """The literal ``choices`` of an ``add_argument("--format", choices=[...])`` call in
    ``tree`` (a command module's source), read without importing the module."""
    for node in ast.walk(tree):
        is_format = (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "add_argument"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and node.args[0].value == "--format"
        )
        if not is_format:
            continue
        for keyword in node.keywords:  # type: ignore[attr-defined]
            if keyword.arg == "choices" and isinstance(keyword.value, (ast.List, ast.Tuple)):
                return [str(e.value) for e in keyword.value.elts if isinstance(e, ast.Constant)]
    return []


#: Width of ``radio-lit --help``'s lines; a longer summary goes on over further lines.
WIDTH = 92


def overview(subcommands: Mapping[str, str]) -> str:
    """The text of ``radio-lit --help``: usage, then each command with its summary
    (``subcommands``: radio-lit's own, name -> ``"module:function"``), wrapped, never cut."""
    rows = [(name, line) for name, line in LIGHTNING_COMMANDS.items()]
    rows += [(name, command_summary(name, target)) for name, target in subcommands.items()]
    width = max(len(name) for name, _ in rows)
    indent = " " * (width + 4)
    commands = [
        textwrap.fill(
            line,
            WIDTH,
            initial_indent=f"  {name.ljust(width)}  ",
            subsequent_indent=indent,
            break_on_hyphens=False,
            break_long_words=False,
        )
        for name, line in rows
    ]
    lines = [
        "usage: radio-lit COMMAND [options]",
        "       radio-lit --version",
        "",
        "Agglomerative multi-teacher distillation (AM-RADIO, RADIOv2.5, PHI-S) on Lightning.",
        "",
        "commands:",
        *commands,
        "",
        "radio-lit COMMAND --help shows a command's options (fit, validate, test: radio-lit's own;",
        "--help-all: every option, Lightning's included).",
    ]
    return "\n".join(lines)
