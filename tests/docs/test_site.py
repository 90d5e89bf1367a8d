"""The documentation site builds with ``mkdocs build --strict`` (every page in the nav, no
broken link or anchor, every API reference entry found in the code and its docstrings
parsed), and its search finds what a newcomer searches for."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as ``mkdocs build --strict`` writes it (a few seconds)."""
    out = tmp_path_factory.mktemp("site")
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return out


def _nav_pages(nav: list) -> list[str]:
    pages = []
    for entry in nav:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += _nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_is_in_the_nav_in_a_newcomers_order(site: Path) -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8").split("\nnav:")[0])
    assert config["strict"] is True
    nav = yaml.safe_load("nav:" + (ROOT / "mkdocs.yml").read_text().split("\nnav:", 1)[1])["nav"]
    pages = _nav_pages(nav)
    on_disk = sorted(p.relative_to(ROOT / "docs").as_posix() for p in (ROOT / "docs").rglob("*.md"))
    assert sorted(pages) == on_disk
    order = ["index.md", "installing.md", "first-run.md", "own-images.md", "configuration.md"]
    assert pages[: len(order)] == order
    assert pages.index("teachers.md") < pages.index("recipes.md") < pages.index("exporting.md")
    assert pages.index("troubleshooting.md") < pages.index("internals.md")
    assert (site / "api" / "normalizers" / "index.html").is_file()


@pytest.mark.parametrize("term", ["PHI-S", "resume", "SLURM", "timm", "ImageFolderDataModule"])
def test_the_search_finds(site: Path, term: str) -> None:
    """Material's search plugin indexes every page's text (``search/search_index.json``)."""
    index = json.loads((site / "search" / "search_index.json").read_text(encoding="utf-8"))
    found = {doc["location"].split("#")[0] for doc in index["docs"] if term in doc["text"]}
    assert len(found) >= 2, (term, found)


def test_the_api_reference_is_written_from_the_docstrings(site: Path) -> None:
    page = (site / "api" / "normalizers" / "index.html").read_text(encoding="utf-8")
    assert "radio_lit.normalizers.PhiS" in page
    assert "theorem 2.1" in page  # PhiS's docstring
    assert "Hadamard" in page


def test_the_api_reference_renders_the_docstrings_sphinx_roles_as_links(site: Path) -> None:
    """The docstrings' ``:func:`…```, ``:class:`~…``` (docs_hooks/sphinx_roles.py) are links to
    the objects' entries, or code text for objects the reference does not render; no page
    prints a role as text."""
    role = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|obj|exc):")
    pages = sorted((site / "api").rglob("*.html"))
    assert len(pages) >= 12
    raw = {p.parent.name: len(role.findall(p.read_text(encoding="utf-8"))) for p in pages}
    assert not {page: n for page, n in raw.items() if n}, raw
    training = (site / "api" / "training" / "index.html").read_text(encoding="utf-8")
    link = 'href="#radio_lit.training.losses.mesa_term"><code>radio_lit.training.losses.mesa_term'
    assert link in training  # :func:`radio_lit.training.losses.mesa_term`
    assert training.count('class="autorefs autorefs-internal"') > 50
