"""Fixtures for every test."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

#: Rough cost of a test for ordering the work of pytest-xdist's workers (see below).
_COST = {"slurm": 8.0, "distributed": 3.0, "slow": 2.0}


def pytest_configure(config: pytest.Config) -> None:
    """Under pytest-xdist (``-n 2``, one worker per core) each worker and every process it
    starts uses one thread: two workers of two spinning threads each on two cores run many
    times slower than one."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        os.environ["OMP_NUM_THREADS"] = "1"
        torch.set_num_threads(1)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """pytest-xdist's work units (``--dist loadgroup``): a test module is one unit, so that its
    module fixtures are set up once, unless its tests name a group of their own
    (``pytest.mark.xdist_group``: modules that share one cache). The costliest units come
    first, so that no long one starts last."""
    groups: dict[str, list[pytest.Item]] = {}
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))
        groups.setdefault(item.get_closest_marker("xdist_group").args[0], []).append(item)

    def cost(tests: list[pytest.Item]) -> float:
        return sum(
            max((c for m, c in _COST.items() if t.get_closest_marker(m)), default=0.1)
            for t in tests
        )

    items[:] = [t for tests in sorted(groups.values(), key=cost, reverse=True) for t in tests]


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
