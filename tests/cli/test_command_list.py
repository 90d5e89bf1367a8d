"""``radio-lit --help`` and a bare ``radio-lit`` list every command with one line each."""

from __future__ import annotations

import re

import pytest

from radio_lit import __version__, cli
from radio_lit.cli.commands import LIGHTNING_COMMANDS


def _command_lines(text: str) -> dict[str, str]:
    """``{command: its summary}``, a summary's wrapped lines joined."""
    rows = text.split("commands:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    lines: dict[str, str] = {}
    for row in rows:
        if row.startswith("   "):  # the summary goes on
            lines[next(reversed(lines))] += " " + row.strip()
        else:
            name, line = row.split(None, 1)
            lines[name] = line
    return lines


def _help(argv: list[str], capsys) -> str:
    """What ``radio-lit ARGV`` prints (argparse's ``--help`` exits with status 0)."""
    try:
        cli.main(argv)
    except SystemExit as stopped:
        assert stopped.code in (0, None)
    return capsys.readouterr().out


def test_help_lists_every_command_with_a_summary(capsys) -> None:
    """Lightning's fit / validate / test and every radio-lit command (was: Lightning's help,
    four subcommands, export / evaluate / cache / ablate invisible)."""
    cli.main(["--help"])
    text = capsys.readouterr().out
    assert text.startswith("usage: radio-lit COMMAND")
    lines = _command_lines(text)
    assert list(lines) == [*LIGHTNING_COMMANDS, *cli.SUBCOMMANDS]
    for name, line in lines.items():  # a sentence, not a usage line or the command's name
        assert len(line.split()) >= 4 and "radio-lit" not in line and "``" not in line, name
    assert "export" in lines and "ONNX" in lines["export"]


def test_a_bare_command_lists_the_commands_and_exits_2(capsys) -> None:
    with pytest.raises(SystemExit) as stopped:
        cli.main([])
    assert stopped.value.code == 2
    assert set(_command_lines(capsys.readouterr().err)) >= {"fit", "cache", "ablate"}


def test_help_cuts_no_summary_and_lists_the_export_formats(capsys) -> None:
    """Each summary is its command's whole first docstring paragraph, wrapped, never cut (was:
    "ablate  train every ablation row and write the PHI-S tables (or, with"), and the export
    line lists every ``--format`` that ``radio-lit export --help`` offers (was: no ``hf``)."""
    lines = _command_lines(_help(["--help"], capsys))
    for name, line in lines.items():
        assert line.count("(") == line.count(")"), (name, line)
    assert "--row-set c-radio, the C-RADIOv4 rows' tables)" in lines["ablate"]
    export_help = _help(["export", "--help"], capsys)
    choices = re.search(r"--format \{([\w,]+)\}", export_help).group(1).split(",")
    assert "hf" in choices
    assert f"(--format {'|'.join(choices)})" in lines["export"]
    assert max(len(x) for x in _help(["--help"], capsys).splitlines()) <= 92


def test_version(capsys) -> None:
    cli.main(["--version"])
    assert capsys.readouterr().out.startswith(f"radio-lit {__version__} (torch ")
