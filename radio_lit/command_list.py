"""``radio-lit --help`` (and a bare ``radio-lit``): every command, one line each.

LightningCLI's own help lists only its subcommands; radio-lit's commands (``predict``,
``evaluate``, ``export``, ``cache``, ``ablate``...) run outside it. Each radio-lit command's
line is the first line of its module's docstring (``"``radio-lit NAME``: what it does."``),
read without importing the module, so a new command lists itself.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Mapping
from pathlib import Path

#: LightningCLI's subcommands that ``radio-lit`` runs through :class:`~radio_lit.cli.RadioLitCLI`.
LIGHTNING_COMMANDS: dict[str, str] = {
    "fit": "train a student: --config FILE [--config overlay.yaml] [--section.key value]",
    "validate": "the validation metrics of --ckpt_path on data.init_args.val_dir",
    "test": "Lightning's test loop over data.init_args.val_dir with --ckpt_path",
}


def command_summary(name: str, target: str) -> str:
    """The one-line summary of the command ``name`` run by ``target`` (``"module:function"``):
    the first line of the module's docstring without its ``radio-lit NAME`` prefix."""
    spec = importlib.util.find_spec(target.split(":")[0])
    origin = spec.origin if spec is not None else None
    if origin is None:
        return ""
    docstring = ast.get_docstring(ast.parse(Path(origin).read_text(encoding="utf-8"))) or ""
    first = docstring.strip().splitlines()[0] if docstring.strip() else ""
    prefix = f"``radio-lit {name}``:"
    summary = first.removeprefix(prefix) if first.startswith(prefix) else first
    return summary.strip().rstrip(".")


def overview(subcommands: Mapping[str, str]) -> str:
    """The text of ``radio-lit --help``: usage, then each command with its summary
    (``subcommands``: radio-lit's own, name -> ``"module:function"``)."""
    rows = [(name, line) for name, line in LIGHTNING_COMMANDS.items()]
    rows += [(name, command_summary(name, target)) for name, target in subcommands.items()]
    width = max(len(name) for name, _ in rows)
    lines = [
        "usage: radio-lit COMMAND [options]",
        "",
        "Agglomerative multi-teacher distillation (AM-RADIO, RADIOv2.5, PHI-S) on Lightning.",
        "",
        "commands:",
        *(f"  {name.ljust(width)}  {line}" for name, line in rows),
        "",
        "radio-lit COMMAND --help shows a command's options.",
    ]
    return "\n".join(lines)
