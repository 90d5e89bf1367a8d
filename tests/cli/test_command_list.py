"""``radio-lit --help`` and a bare ``radio-lit`` list every command with one line each."""

from __future__ import annotations

import pytest

from radio_lit import cli
from radio_lit.command_list import LIGHTNING_COMMANDS


def _command_lines(text: str) -> dict[str, str]:
    rows = text.split("commands:\n", 1)[1].split("\n\n", 1)[0].splitlines()
    return {row.split()[0]: row.split(None, 1)[1] for row in rows}


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
