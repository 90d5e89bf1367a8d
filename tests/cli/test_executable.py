"""Printed commands use the ``radio-lit`` the user ran (``.venv/bin/radio-lit`` from the README)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from radio_lit.cli.cache import fit_command
from radio_lit.core.executable import executable


@pytest.mark.parametrize(
    ("typed", "printed"),
    [
        (".venv/bin/radio-lit", ".venv/bin/radio-lit"),
        ("/opt/env/bin/radio-lit", "/opt/env/bin/radio-lit"),
        ("radio-lit", "radio-lit"),
        ("/src/radio_lit/__main__.py", "radio-lit"),  # python -m radio_lit
        ("", "radio-lit"),  # an embedded interpreter
    ],
)
def test_the_printed_command_is_the_one_typed(monkeypatch, typed, printed) -> None:
    monkeypatch.setattr(sys, "argv", [typed, "cache"])
    assert executable() == printed
    command = fit_command(["run.yaml"], ["--trainer.max_steps", "3"], Path("cache"))
    assert command[:4] == [printed, "fit", "--config", "run.yaml"]
