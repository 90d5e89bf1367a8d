"""What the project ships cites no path of a development machine: a user has neither the
developers' shared folder nor their home, so a calibration, a recipe header or a docs page
cites what it rests on by a path inside the project (``benchmarks/results/…``)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("radio_lit", "configs", "docs")
# an absolute path into a machine's own folders, or the developers' shared folder by any route
MACHINE_PATH = re.compile(
    r"(?<![\w.:/])/(?:work|root|home|tmp|mnt|opt)/[\w.-]+"
    r"|\.\./shared/|\bshared/(?:papers|measurements|tools)/"
)


def _shipped_files() -> list[Path]:
    suffixes = {".py", ".yaml", ".yml", ".md", ".txt", ".json"}
    return [
        path
        for top in SHIPPED
        for path in sorted((ROOT / top).rglob("*"))
        if path.is_file() and path.suffix in suffixes and "__pycache__" not in path.parts
    ]


def test_the_pattern_catches_what_it_is_for() -> None:
    assert MACHINE_PATH.search("source: /work/shared/measurements/h100.md")
    assert MACHINE_PATH.search("see ../shared/DESIGN.md")
    assert MACHINE_PATH.search("`shared/papers/c-radio-v4-notes.md`")
    assert not MACHINE_PATH.search("source: benchmarks/results/h100-2026-11-26.md")
    assert not MACHINE_PATH.search("https://github.com/NVlabs/RADIO/blob/main/hubconf.py")


def test_no_development_machine_path_is_shipped() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in _shipped_files()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if MACHINE_PATH.search(line)
    ]
    assert not found, "paths of a development machine in the package:\n" + "\n".join(found)


def test_the_cited_measurement_is_in_the_project() -> None:
    calibration = (ROOT / "radio_lit/planning/calibration.yaml").read_text()
    cited = re.search(r"^source: (\S+)", calibration, re.M)
    assert cited and (ROOT / cited.group(1)).is_file()
