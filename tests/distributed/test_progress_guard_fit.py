"""TrainingProgressGuard on 2 gloo ranks under FSDP2 (``ModelParallelStrategy``): a run that
trains nothing stops on both ranks at the same update, each rank having measured its own
shards, with one line naming the parameters, the step and the cause. A rank that stopped
alone would leave the other waiting in a collective (the launch times out)."""

from __future__ import annotations

import pytest
import torch
from packaging.version import Version

from tests.distributed.test_distributed_fit import _Launch

pytestmark = pytest.mark.distributed

#: torch 2.14's FSDP2 finds the tensors of a dataclass output itself; older ones see an
#: unregistered dataclass as one opaque leaf and register no backward hook on its tensors.
HIDES_DATACLASS_OUTPUTS = Version(torch.__version__.split("+")[0]) < Version("2.14")


def stopped_on_both_ranks(kind: str, tmp_path) -> list[str]:
    """The last line each rank printed about the stopped run."""
    code, text = _Launch.start(kind, tmp_path).wait()
    assert code is not None, f"a rank hung (the ranks disagreed?):\n{text[-6000:]}"
    assert code != 0, f"the {kind} run trained to its end:\n{text[-6000:]}"
    ranks = text.split("--- rank ")[1:]
    lines = [
        [line for line in rank.splitlines() if "no training progress at step" in line]
        for rank in ranks
    ]
    assert len(lines) == 2 and all(lines), text[-6000:]
    return [found[-1] for found in lines]


def test_a_learning_rate_of_0_stops_every_rank_at_the_first_update(tmp_path):
    for line in stopped_on_both_ranks("fsdp2-lr0", tmp_path):
        assert "no training progress at step 0: " in line
        assert "parameter group 'heads_decay'" in line and "learning rate is 0" in line


@pytest.mark.skipif(
    not HIDES_DATACLASS_OUTPUTS, reason="torch >= 2.14's FSDP2 sees dataclass outputs"
)
def test_fsdp2_hooks_that_did_not_fire_stop_the_run_when_the_trunk_is_released(tmp_path):
    """The student's output an unregistered dataclass: FSDP2 (torch <= 2.13) registers no
    backward hook on its tensors, no gradient reaches the sharded trunk (the heads, sharded
    apart, still train). FreezeBody releases the trunk at step 1: the guard stops there."""
    for line in stopped_on_both_ranks("fsdp2-hidden", tmp_path):
        assert "no training progress at step 1: student." in line
        assert "got no gradient" in line and "FSDP2" in line
