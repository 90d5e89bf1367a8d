"""``radio-lit plan`` against the runs recorded on GPUs (benchmarks/README.md, "plan"): planned
with the overrides the benchmarks took (``benchmarks/plan_check.py``: each partition one rank's
share of the recipe's world, teachers of 8 blocks, one GPU, ``--step 1``: the measured peaks are
the largest of a warm-up step 0 and timed steps 1 and 2, with the earlier step's gradients and
the optimizer state, and ``FreezeBody`` holding the trunk where the config has it). Tolerances:
memory within 15 %, step time within 25 % of the measured figure.

- ``stage1.yaml`` on one H200: 238.6 ms per step (``train_step.py --device cuda
  --teacher-depth 8``, batch 32, FSDP2 on one rank) and 14.57 GiB peak (``gpu_check.py``,
  batch 32 at its one resolution, 256 px);
- ``recipes/am-radio/stage2.yaml`` on one H200: 91.83 GiB peak (``gpu_check.py``, 2
  partitions, batch 32 + 4, DDP, float32 master weights);
- ``recipes/c-radio/stage1.yaml`` on one H200: 42.91 GiB peak (``gpu_check.py``, batch 16 +
  2), whose partitions drew their resolutions at random in each of its 3 steps (not recorded):
  the plan's step at the largest draws (432 and 1152 px) is an upper bound of it, and the
  distribution of the largest of 3 draws (``plan_check.py --draws``, 24 plans: too slow here)
  has its median within 5 % of it (benchmarks/README.md).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.plan_check import largest_total, plan_arguments, planned

ROOT = Path(__file__).resolve().parents[2]


def _on_one_h200(config: str) -> dict:
    """The plan of ``config`` as measured, its memory at the largest draws only."""
    return planned([*plan_arguments(ROOT / "configs" / config, 8, "h200"), "--largest-draws"])


@pytest.mark.slow
def test_am_radio_stage2_memory_on_one_h200():
    assert abs(largest_total(_on_one_h200("recipes/am-radio/stage2.yaml")) / 91.83 - 1) <= 0.15


@pytest.mark.slow
def test_stage1_step_time_and_memory_on_one_h200():
    stage = _on_one_h200("stage1.yaml")
    assert stage["trunk_frozen"]  # FreezeBody's 5,000 steps hold the trunk at step 1
    assert abs(stage["step_ms"] / 238.6 - 1) <= 0.25
    assert abs(largest_total(stage) / 14.57 - 1) <= 0.15


@pytest.mark.slow
def test_c_radio_stage1_largest_draws_bound_the_measured_peak_on_one_h200():
    stage = _on_one_h200("recipes/c-radio/stage1.yaml")
    assert {p: r[0] for p, r in stage["ranks"][0]["resolutions"].items()} == {
        "low_res": 432,
        "high_res": 1152,
    }
    assert largest_total(stage) >= 42.91
