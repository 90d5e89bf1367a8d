"""Sharded checkpoints (``ModelParallelStrategy(save_distributed_checkpoint=True)``): one
written by 2 gloo ranks resumes on 1 rank with the same model, optimizer and statistics state,
and radio-lit's readers (``model.init_from``, export, evaluate, predict) take its folder."""

from __future__ import annotations

import time

import pytest
import torch

from radio_lit.core.errors import checkpoint_file
from radio_lit.export.checkpoint import read_training_checkpoint, student_weights
from tests import forking
from tests.distributed.test_distributed_fit import _env, _free_port

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

STEPS = 3
WORKER = "tests.cluster.sharded_fit:main"


def _start(out, devices: int, ckpt_path=None, sharded: bool = True) -> list[forking.Forked]:
    port, args = _free_port(), (str(out), devices, STEPS, ckpt_path and str(ckpt_path), sharded)
    envs = [{**_env(port, r), "WORLD_SIZE": str(devices)} for r in range(devices)]
    return [forking.start(WORKER, args, out / f"rank{r}", envs[r]) for r in range(devices)]


def _wait(ranks: list[forking.Forked]) -> None:
    deadline = time.monotonic() + 300
    for rank in ranks:
        outcome = rank.wait(deadline)
        assert outcome.exitcode == 0, outcome.stderr[-4000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The 2-rank run that writes the sharded checkpoints; then, together, a 1-rank run
    resuming its last one (no step left: what it holds is what it restored) and a 2-rank run
    resuming the one of step 2 (written before the trunk's first update: FreezeBody, no
    optimizer state for the trunk); and a 1-rank run writing consolidated checkpoints, with a
    run resuming its checkpoint of step 2."""
    two, one, again = (tmp_path_factory.mktemp(n) for n in ("two-ranks", "one-rank", "again"))
    single = tmp_path_factory.mktemp("consolidated")
    _wait(_start(two, 2) + _start(single, 1, sharded=False))
    checkpoints = two / "checkpoints"
    _wait(
        _start(one, 1, checkpoints / "last.ckpt")
        + _start(again, 2, checkpoints / "epoch=0-step=2.ckpt")
        + _start(single / "resumed", 1, single / "checkpoints" / "epoch=0-step=2.ckpt", False)
    )
    return two, one, again, single


def _states_equal(a: dict, b: dict, exact: bool = True) -> None:
    """Model and optimizer states equal: bit for bit, or within the resume tests' tolerance."""

    def check(x: torch.Tensor, y: torch.Tensor, what: object) -> None:
        if exact:
            assert torch.equal(x, y), what
        else:
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6, msg=str(what))

    assert a["model"].keys() == b["model"].keys()
    for key, value in a["model"].items():
        check(value, b["model"][key], key)
    assert a["optimizer"].keys() == b["optimizer"].keys()
    for name, moments in a["optimizer"].items():
        for key, value in moments.items():
            check(value, b["optimizer"][name][key], (name, key))


def test_a_sharded_checkpoint_resumes_exactly_on_the_same_ranks(runs):
    two, _, again, _ = runs
    saved, resumed = (torch.load(r / "state.pt") for r in (two, again))
    assert saved["step"] == resumed["step"] == STEPS
    _states_equal(saved, resumed, exact=False)


def test_a_sharded_checkpoint_of_2_ranks_resumes_on_1_with_the_same_state(runs):
    two, one, _, _ = runs
    last = two / "checkpoints" / "last.ckpt"
    assert last.is_dir() and (last / ".metadata").is_file()  # shards, not one file
    saved, restored = (torch.load(r / "state.pt") for r in (two, one))
    assert saved["step"] == restored["step"] == STEPS
    assert any(k.startswith("normalizers.") for k in saved["model"])
    _states_equal(saved, restored)


def test_the_readers_take_a_sharded_checkpoint_folder(runs):
    two, _, _, _ = runs
    last = two / "checkpoints" / "last.ckpt"
    assert checkpoint_file(last, "--ckpt_path") == last  # fit, evaluate, predict, export
    state = read_training_checkpoint(last)
    saved = torch.load(two / "state.pt")["model"]
    assert state["global_step"] == STEPS
    for key, value in saved.items():
        assert torch.equal(state["state_dict"][key], value), key
    own = [k for k in saved if k.startswith(("student.", "heads."))]
    weights, new = student_weights(last, own, ["clip", "dino", "sam"])  # model.init_from
    assert new == [] and set(weights) == set(own)


def test_a_consolidated_checkpoint_of_a_frozen_trunk_resumes_exactly(runs):
    """Lightning's load of a single-file checkpoint under ModelParallelStrategy asked for the
    teachers' weights, which checkpoints leave out, and gave the frozen trunk optimizer state."""
    *_, single = runs
    saved, resumed = (torch.load(r / "state.pt") for r in (single, single / "resumed"))
    assert saved["step"] == resumed["step"] == STEPS
    _states_equal(saved, resumed)
