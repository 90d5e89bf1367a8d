"""Sharded checkpoints (``ModelParallelStrategy(save_distributed_checkpoint=True)``): one
written by 2 gloo ranks resumes on 1 rank with the same model, optimizer and statistics state,
and radio-lit's readers (``model.init_from``, export, evaluate, predict) take its folder."""

from __future__ import annotations

import time

import pytest
import torch

from radio_lit.errors import checkpoint_file
from radio_lit.export.checkpoint import read_training_checkpoint, student_weights
from tests import forking
from tests.distributed.test_distributed_fit import _env, _free_port

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

STEPS = 3
WORKER = "tests.cluster.sharded_fit:main"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The 2-rank run that writes the sharded checkpoints, then the 1-rank run resuming its
    last one (no step left to train: what it holds is what it restored)."""
    two, one = tmp_path_factory.mktemp("two-ranks"), tmp_path_factory.mktemp("one-rank")
    port = _free_port()
    ranks = [forking.start(WORKER, (str(two), 2, STEPS), two / f"rank{r}", _env(port, r))
             for r in range(2)]  # fmt: skip
    deadline = time.monotonic() + 300
    for rank in ranks:
        outcome = rank.wait(deadline)
        assert outcome.exitcode == 0, outcome.stderr[-4000:]
    last = two / "checkpoints" / "last.ckpt"
    env = {**_env(_free_port(), 0), "WORLD_SIZE": "1"}
    outcome = forking.run(WORKER, (str(one), 1, STEPS, str(last)), one / "rank0", env=env)
    assert outcome.exitcode == 0, outcome.stderr[-4000:]
    return two, one


def test_a_sharded_checkpoint_of_2_ranks_resumes_on_1_with_the_same_state(runs):
    two, one = runs
    last = two / "checkpoints" / "last.ckpt"
    assert last.is_dir() and (last / ".metadata").is_file()  # shards, not one file
    saved, restored = (torch.load(r / "state.pt") for r in (two, one))
    assert saved["step"] == restored["step"] == STEPS
    assert any(k.startswith("normalizers.") for k in saved["model"])
    assert saved["model"].keys() == restored["model"].keys()
    for key, value in saved["model"].items():
        assert torch.equal(value, restored["model"][key]), key
    assert saved["optimizer"].keys() == restored["optimizer"].keys()
    for name, moments in saved["optimizer"].items():
        for key, value in moments.items():
            assert torch.equal(value, restored["optimizer"][name][key]), (name, key)


def test_the_readers_take_a_sharded_checkpoint_folder(runs):
    two, _ = runs
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
