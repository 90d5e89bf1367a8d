import sys

import pytest


@pytest.fixture(autouse=True)
def command_line(monkeypatch):
    """The CLI reads its arguments from ``args=``, as ``radio-lit`` with nothing more."""
    monkeypatch.setattr(sys, "argv", ["radio-lit"])
