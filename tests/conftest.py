"""Fixtures for every test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.caller_check import frames_only_caller_check

# ~0.1 CPU-s less per radio-lit command a test runs in-process (tests/caller_check.py)
frames_only_caller_check()

#: Rough cost of a test, for ordering pytest-xdist's work (:func:`pytest_collection_modifyitems`).
_COST = {"slurm": 8.0, "distributed": 3.0, "slow": 2.0}
#: Folders whose modules are one unit of work: tests/configs share one cache (the shipped
#: configs' builds); each module of tests/cluster starts many processes (SLURM jobs, torchrun
#: agents and their ranks), and two such at once on two cores slow both.
_SHARED = ("tests/configs/", "tests/cluster/")


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n 2``, one worker per core) each worker and every process it
    starts uses one thread: two workers of two spinning threads each on two cores run many
    times slower than one."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


def _unit(nodeid: str) -> str:
    """A test's unit of pytest-xdist work: its module (so that module fixtures are set up
    once), or the folder of :data:`_SHARED` it is in."""
    path = nodeid.split("::")[0]
    return next((folder for folder in _SHARED if path.startswith(folder)), path)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Each worker takes whole units (:func:`_unit`), in collection order."""
    from xdist.scheduler import LoadScopeScheduling

    class UnitScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return UnitScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The costliest units first (by their tests' marks), so that no long one starts last."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(_unit(item.nodeid), []).append(item)

    def cost(tests: list[pytest.Item]) -> float:
        return sum(
            max((c for m, c in _COST.items() if t.get_closest_marker(m)), default=0.1)
            for t in tests
        )

    items[:] = [t for tests in sorted(units.values(), key=cost, reverse=True) for t in tests]


@pytest.fixture(autouse=True)
def hub_offline_mode_restored() -> Iterator[None]:
    """``radio-lit`` sets the Hugging Face Hub offline when it cannot reach it
    (:mod:`radio_lit.cli.hub`); a test that runs the command in this process must not leave the
    next test offline."""
    from huggingface_hub import constants

    env, flag = os.environ.get("HF_HUB_OFFLINE"), constants.HF_HUB_OFFLINE
    yield
    constants.HF_HUB_OFFLINE = flag
    if env is None:
        os.environ.pop("HF_HUB_OFFLINE", None)
    else:
        os.environ["HF_HUB_OFFLINE"] = env
