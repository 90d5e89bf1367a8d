"""``radio-lit plan`` against the runs recorded on one NVIDIA H200 (benchmarks/README.md,
2026-11-28): planned with the overrides the benchmarks took (``benchmarks/plan_check.py``:
each partition one rank's share of the recipe's world, teachers of 8 blocks, one GPU).
Tolerances: memory within 15 %, step time within 25 % of the measured figure.

- ``stage1.yaml``: 238.6 ms per step (``train_step.py --device cuda --teacher-depth 8``,
  batch 32, FSDP2 on one rank) and 14.57 GiB peak (``gpu_check.py``, batch 32 at its one
  resolution, 256 px: the memory model's check at a fixed resolution);
- ``recipes/am-radio/stage2.yaml``: 91.83 GiB peak (``gpu_check.py``, 2 partitions, batch 36,
  DDP) is **not** met: the plan gives ~77 GiB (0.84), the one DDP run under-counted by a part
  not yet found (benchmarks/README.md, "plan"). A strict ``xfail``;
- ``recipes/c-radio/stage1.yaml``: 42.91 GiB peak (``gpu_check.py``, batch 16 + 2) is **not**
  met (the plan: ~58 GiB): the plan counts both partitions at their largest resolution in the
  same step (432 and 1152 px), the measured run drew each partition's resolution at random
  for its 3 steps (the plan at 256 and 768 px: ~42 GiB). A strict ``xfail``.

Each strict ``xfail`` fails the day the plan meets it: the figure is then to be moved to the
passing cases.
"""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from benchmarks.plan_check import plan_arguments
from radio_lit.cli import plan

ROOT = Path(__file__).resolve().parents[2]


def _plan(config: str) -> dict:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        plan.main(plan_arguments(ROOT / "configs" / config, 8, "h200"))
    return json.loads(out.getvalue())


def _memory(stage: dict) -> float:
    return max(rank["memory_gib"]["total"] for rank in stage["ranks"])


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="DDP: 16 % under, a part not yet found (docstring)")
def test_am_radio_stage2_memory_on_one_h200():
    assert abs(_memory(_plan("recipes/am-radio/stage2.yaml")) / 91.83 - 1) <= 0.15


@pytest.mark.slow
def test_stage1_step_time_and_memory_on_one_h200():
    stage = _plan("stage1.yaml")
    assert abs(stage["step_ms"] / 238.6 - 1) <= 0.25
    assert abs(_memory(stage) / 14.57 - 1) <= 0.15


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="largest resolutions of both partitions (docstring)")
def test_c_radio_stage1_memory_on_one_h200():
    assert abs(_memory(_plan("recipes/c-radio/stage1.yaml")) / 42.91 - 1) <= 0.15
