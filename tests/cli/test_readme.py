"""The manual (README.md and the pages of docs/) against the CLI: its commands, their options,
the export formats and the files each writes, all taken from the CLI itself (``radio-lit
--help``, each command's ``--help``, ``radio-lit fit --help-all``, a real export of a tiny run),
so that a command, option or format added without its line in the manual (or a line left for
one removed) fails here."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import yaml

from radio_lit.cli import app as cli
from radio_lit.normalizers import PhiS
from tests.builders import tiny_module, tiny_student
from tests.cli.test_command_list import _command_lines, _help
from tests.export.tiny_export import STUDENT, saved_run

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
#: The task pages of the documentation site (the API reference is written from docstrings).
PAGES = {
    path.relative_to(ROOT).as_posix(): path.read_text(encoding="utf-8")
    for path in sorted((ROOT / "docs").glob("*.md"))
}
#: README.md and the pages, each a text of its own (a page's sections stop at its end).
MANUAL = {"README.md": README, **PAGES}
ALL = "\n".join(MANUAL.values())
#: An option of a help text (``--format``, ``--samples-per-shard``; not ``--trainer.x``).
OPTION = re.compile(r"(?<![\w-])--[a-z][\w-]*(?![\w.+-])")
#: An option a README line gives (``--model.normalizer`` too).
GIVEN = re.compile(r"(?<![\w-])--[a-z][\w.+-]*")
#: Formats whose files their own test exports and checks against the manual
#: (:func:`unnamed_in_manual`): an ONNX export traces the model (~10 CPU-s), once is enough.
EXPORTED_ELSEWHERE = {"onnx": "tests/export/test_onnx.py"}
#: ``radio-lit COMMAND`` where a fenced line runs it (first, after ``$``, a path, ``&&``, or
#: torchrun's ``--no-python``), not in prose such as a file listing.
RUN = re.compile(r"(?:^\s*(?:\$\s+)?|&&\s*|--no-python\s+|/)radio-lit ([a-z]+)\b(.*)")


def _sections(text: str) -> list[str]:
    """``text`` cut at its headings (``#`` lines outside fenced code)."""
    sections, current, fenced = [], [], False
    for line in text.splitlines():
        fenced ^= line.startswith("```")
        if line.startswith("#") and not fenced and current:
            sections.append("\n".join(current))
            current = []
        current.append(line)
    return [*sections, "\n".join(current)]


def _code(text: str) -> tuple[list[str], list[str]]:
    """The code of ``text``: the lines of its fenced blocks (``\\``-continued lines joined,
    ``#`` comments dropped), and its inline ``code`` spans."""
    items, fenced, pending = [], False, ""
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
            continue
        if fenced:
            line = pending + re.sub(r"(^|\s)#.*", "", line)
            pending = line[:-1] + " " if line.rstrip().endswith("\\") else ""
            if not pending:
                items.append(line)
    prose = re.sub(r"```.*?```", "", text, flags=re.S)
    return items, re.findall(r"`([^`\n]+)`", prose)


def _invocations(text: str) -> list[tuple[str, list[str]]]:
    """``(command, its options)`` of every ``radio-lit COMMAND …`` in the code of ``text``
    (the options up to a shell operator)."""
    fenced, spans = _code(text)
    matches = [m for line in fenced for m in RUN.finditer(line)]
    matches += [m for span in spans for m in re.finditer(r"radio-lit ([a-z]+)\b(.*)", span)]
    return [(m.group(1), GIVEN.findall(re.split(r"&&|;|\|\|", m.group(2))[0])) for m in matches]


def _options(command: str, capsys) -> set[str]:
    return set(OPTION.findall(_help([command, "--help"], capsys))) - {"--help"}


def _manual_invocations() -> list[tuple[str, list[str]]]:
    return [found for text in MANUAL.values() for found in _invocations(text)]


def test_the_manual_shows_every_command_and_no_other(capsys):
    commands = set(_command_lines(_help(["--help"], capsys)))
    shown = {command for command, _ in _manual_invocations()}
    assert commands - shown == set(), "commands the manual never shows"
    assert shown - commands == set(), "commands in the manual that radio-lit does not have"
    assert {command for command, _ in _invocations(README)} >= {"fit", "export"}  # the tour


@pytest.mark.parametrize("command", list(cli.SUBCOMMANDS))
def test_each_option_is_documented_where_its_command_is(command, capsys):
    """Every option of ``radio-lit COMMAND --help`` appears in a section of the manual that
    shows ``radio-lit COMMAND``, and every option the manual gives that command is one of them
    (``--section.key`` config overrides aside)."""
    options = _options(command, capsys)
    sections = "\n".join(
        s for text in MANUAL.values() for s in _sections(text) if f"radio-lit {command}" in s
    )
    documented = {o for o in options if re.search(re.escape(o) + r"(?![\w-])", sections)}
    assert options - documented == set(), f"radio-lit {command} options not in its sections"
    given = {o for c, found in _manual_invocations() if c == command for o in found}
    assert {o for o in given if "." not in o} - options == set(), "options it does not have"


def test_the_manuals_fit_options_are_fits(capsys):
    """``radio-lit fit|validate|test`` lines give only options of ``radio-lit fit --help-all``:
    a ``--section.key`` by its section, and a ``--model.KEY`` or ``--trainer.KEY`` by its
    key (``DistillationModule``'s and the Trainer's arguments; a class's own ``init_args``
    below them are checked when the config is parsed)."""
    full = _help(["fit", "--help-all"], capsys)
    options = set(OPTION.findall(full)) | _options("fit", capsys)
    keys = set(re.findall(r"(?<![\w-])--((?:model|trainer)\.\w+)", full))
    given = {
        o for c, found in _manual_invocations() if c in ("fit", "validate", "test") for o in found
    }
    assert {o.split(".")[0] for o in given} - options == set()
    named = {".".join(o.lstrip("-").split(".")[:2]) for o in given if o.count(".")}
    assert {k for k in named if k.split(".")[0] in ("model", "trainer")} - keys == set()


@pytest.fixture(scope="module")
def exports(tmp_path_factory):
    """``{format: files written}`` (names relative to the output; None where the format
    refuses this student) of ``radio-lit export --format F --output OUT/last`` for every format
    ``radio-lit export --help`` offers, from a tiny run saved as ``radio-lit fit`` leaves it."""
    torch.manual_seed(0)
    module = tiny_module(student=tiny_student(**STUDENT["init_args"]), normalizer=PhiS)
    for name, output in module.run_teachers(torch.rand(2, 3, 96, 96)).items():
        module.normalizers[name].update(output.features)
        module.normalizers[name].fit()
    root = tmp_path_factory.mktemp("exports")
    checkpoint = saved_run(module.eval(), root / "run")
    help_text = _help_text(["export", "--help"])
    formats = re.search(r"--format \{([\w,]+)\}", help_text).group(1).split(",")
    written = {}
    for fmt in formats:
        out = root / fmt
        if fmt in EXPORTED_ELSEWHERE:
            written[fmt] = []
            continue
        try:
            cli.main(["export", str(checkpoint), "--format", fmt, "--output", str(out / "last")])
        except SystemExit as refused:
            assert refused.code == 2
            written[fmt] = None
            continue
        written[fmt] = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    return written


def unnamed_in_manual(files: list[str]) -> list[str]:
    """The files of an export (names relative to its output) that the manual does not name:
    ``last<suffix>`` or ``<stem><suffix>`` beside a stem, a folder's files by name."""
    unnamed = []
    for name in files:
        if name.startswith("last."):
            suffix = name.removeprefix("last")
            named = f"last{suffix}" in ALL or f"<stem>{suffix}" in ALL
        else:
            named = Path(name).name in ALL
        if not named:
            unnamed.append(name)
    return unnamed


def _help_text(argv: list[str]) -> str:
    """What ``radio-lit ARGV`` prints, outside pytest's capture (module fixtures have none)."""
    import contextlib
    import io

    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.suppress(SystemExit):
        cli.main(argv)
    return printed.getvalue()


@pytest.mark.slow
def test_every_export_format_and_its_files_are_in_the_manual(exports):
    """Each ``--format`` is named (``--format hf`` or in a ``--format a|b|c`` list) and no
    other; each file an export wrote is named (:func:`unnamed_in_manual`; the formats of
    :data:`EXPORTED_ELSEWHERE` in their own tests)."""
    documented = {f for values in re.findall(r"--format ([\w|]+)", ALL) for f in values.split("|")}
    assert set(exports) - documented == set(), "formats the manual does not name"
    assert documented - set(exports) == set(), "formats in the manual that export does not have"
    assert any(files for files in exports.values()), exports
    for fmt, files in exports.items():
        assert unnamed_in_manual(files or []) == [], fmt


def test_the_quickstart_takes_the_time_the_readme_says():
    """The quickstart config's header and README's first command state one duration."""
    header = (ROOT / "configs" / "quickstart.yaml").read_text().split("\n\n")[0]
    words = {"a": 1, "one": 1, "two": 2, "three": 3}

    def minutes(text: str) -> int:
        found = re.search(r"about (\w+) minutes?", text)
        assert found, text[:400]
        return int(words.get(found.group(1), found.group(1)))

    readme = README.split("## The two commands", 1)[1].split("```", 1)[0]
    assert minutes(header) == minutes(readme)
    assert yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())["trainer"]


def test_ci_runs_the_readmes_test_command():
    """``.ci/run`` runs exactly the README's second command (the tests from a fresh machine)
    first, before its oldest-versions run, and the README's first command trains the
    quickstart."""
    commands = re.findall(r"```bash\n(python3 -m venv .*?)\n```", README)
    assert len(commands) == 2, commands
    quickstart, tests = commands
    assert quickstart.endswith("radio-lit fit --config configs/quickstart.yaml")
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8").strip().splitlines()
    runs = [line for line in ci if "-m pytest" in line]
    assert runs[0] == tests, runs


@pytest.mark.parametrize("page", ["README.md", "docs/first-run.md"])
def test_the_sample_results_are_what_fit_prints_and_marked_as_varying(page):
    """The quickstart's results shown in the manual are laid out as ``radio-lit fit`` prints
    them (:func:`radio_lit.cli.results.results_table` of the values shown: rows, columns,
    ``-`` cells, 4 significant digits; ``…`` marks rows left out), the geomean is that of
    the fidelities shown, and the text says that the figures vary by machine."""
    from radio_lit.cli.results import results_table

    text = MANUAL[page]
    block = re.search(r"```\n(results at step (\d+)\n.*?)\n\n", text, flags=re.S)
    assert block, page
    lines = [line for line in block.group(1).splitlines() if line != "…"]
    columns = lines[1].split()
    values: dict[str, float] = {}
    for line in lines[2:]:
        tag, *cells = line.split()
        if not cells[1:]:
            values[tag] = float(cells[0])
            continue
        assert len(cells) == len(columns), line
        prefix, metric = tag.rsplit("/", 1)
        for column, cell in zip(columns, cells, strict=True):
            if cell != "-":
                key = f"val/{column}/{metric}" if prefix == "val" else f"{prefix}/{column}/{metric}"
                values[key] = float(cell)
    rendered = results_table(values, int(block.group(2))).splitlines()
    assert [" ".join(line.split()) for line in rendered] == [" ".join(x.split()) for x in lines]
    fidelities = [v for k, v in values.items() if k.startswith("val/") and k.endswith("/fidelity")]
    geomean = math.prod(fidelities) ** (1 / len(fidelities))
    assert values["val/fidelity_geomean"] == pytest.approx(geomean, rel=1e-3)
    after = text[block.end() : block.end() + 400] + text[block.start() - 400 : block.start()]
    assert re.search(r"vary by\s+machine", after), page
