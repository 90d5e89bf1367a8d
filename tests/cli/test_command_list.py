"""``radio-lit --help`` and a bare ``radio-lit`` list every command with one line each."""

from __future__ import annotations

import inspect
import re

import pytest

from radio_lit import __version__, cli
from radio_lit.cli.commands import LIGHTNING_COMMANDS
from radio_lit.module import DistillationModule


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


def test_fit_help_leads_with_radio_lits_options_and_help_all_has_lightnings(capsys) -> None:
    """``radio-lit fit --help`` is one screen of radio-lit's own options: the run's, every
    ``DistillationModule`` argument (``--model.KEY``), the data module, the Trainer's option
    names (was: LightningCLI's 3,700 lines, the model's after 470 of the Trainer's);
    ``--help-all`` is LightningCLI's full help."""
    short = _help(["fit", "--help"], capsys)
    assert short.startswith("usage: radio-lit fit --config FILE")
    assert len(short.splitlines()) < 150
    assert max(len(x) for x in short.splitlines()) <= 92
    for option in ("--config", "--print_config", "--ckpt_path", "--data CLASS", "--help-all"):
        assert option in short, option
    arguments = set(inspect.signature(DistillationModule.__init__).parameters) - {"self"}
    assert {a for a in arguments if f"--model.{a}" not in short} == set()
    assert short.index("--model.student ") < short.index("max_steps")  # ours first
    assert "(default: radio_lit.losses.Weighted)" in short  # the balancer's default
    full = _help(["fit", "--help-all"], capsys)
    assert len(full.splitlines()) > 1000
    assert "--trainer.max_steps MAX_STEPS" in full and "--model.fsdp2.layout" in full
    assert _help(["validate", "--help"], capsys).startswith("usage: radio-lit validate")


@pytest.mark.parametrize("name", ["radio_lit.teachers.RADIOTeacher", "DINOv3Teacher"])
def test_a_teacher_class_lists_its_arguments_as_an_entrys(name, capsys) -> None:
    """``radio-lit fit --model.teachers.help CLASS`` (a full path or the class's name) lists
    every argument the teacher class takes, as the flag that sets it for one teacher (was:
    "Option 'model' is required", the class taken for a teacher named ``help``); with a
    config too."""
    from radio_lit import teachers

    cls = getattr(teachers, name.rsplit(".", 1)[-1])
    for config in ([], ["--config", "configs/quickstart.yaml"]):
        shown = _help(["fit", *config, "--model.teachers.help", name], capsys)
        assert f"Help for --model.teachers.help=radio_lit.teachers.{cls.__name__}" in shown
        arguments = set(inspect.signature(cls).parameters)
        listed = set(re.findall(r"--model\.teachers\.NAME\.init_args\.(\w+)", shown))
        assert listed == arguments, arguments ^ listed
    with pytest.raises(SystemExit) as refused:
        cli.main(["fit", "--model.teachers.help", "radio_lit.normalizers.PhiS"])
    assert refused.value.code == 2
    assert "is not a subclass of Teacher" in capsys.readouterr().err
