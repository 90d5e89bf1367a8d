"""Fixtures for every test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def hub_offline_mode_restored() -> Iterator[None]:
    """``radio-lit`` sets the Hugging Face Hub offline when it cannot reach it
    (:mod:`radio_lit.hub`); a test that runs the command in this process must not leave the
    next test offline."""
    from huggingface_hub import constants

    env, flag = os.environ.get("HF_HUB_OFFLINE"), constants.HF_HUB_OFFLINE
    yield
    constants.HF_HUB_OFFLINE = flag
    if env is None:
        os.environ.pop("HF_HUB_OFFLINE", None)
    else:
        os.environ["HF_HUB_OFFLINE"] = env
