"""The ranks' waiting in a planned step (:mod:`radio_lit.planning.layout`)."""

from __future__ import annotations

import pytest

from radio_lit.planning.layout import balanced, layout_name, rank_counts, waiting
from radio_lit.training.partitions import Partition, PartitionPlan


def test_the_report_layouts_waiting_at_64_h100s():
    """Issue 52's figures of C-RADIOv4 stage 1 at 64 H100s (docs/cost.md, main 2739ac6): a
    low-res rank averages 1,071.0 ms over its draws, a high-res one 1,549.4 ms, 32 ranks each,
    84.9 ms of collectives, a 1,835.1 ms step and 9,787 GPU-hours: every rank at the mean work
    would step in ~1,395 ms, so ~24 % of the GPU-hours are ranks waiting."""
    wait = waiting({0: 1071.0, 32: 1549.4}, {0: 32, 32: 32}, 1835.1, 84.9, 9787.0)
    assert wait["mean_work_ms"] == pytest.approx(1395.1)
    assert wait["idle_share"] == pytest.approx(0.2398, abs=1e-4)
    assert wait["idle_gpu_hours"] == pytest.approx(0.2398 * 9787.0, rel=1e-3)
    assert wait["ranks"][32] == {"count": 32, "mean_work_ms": pytest.approx(1634.3)}
    even = waiting({0: 1310.2}, {0: 64}, 1395.1, 84.9, None)
    assert even["idle_share"] == pytest.approx(0.0, abs=1e-12) and even["idle_gpu_hours"] is None


def test_the_balanced_plan_of_the_same_partitions():
    parts = {
        "low_res": Partition(batch_size=1024, resolutions=[128, 432]),
        "high_res": Partition(batch_size=128, resolutions=[512, 1152], rank_share=1.0),
    }
    report = PartitionPlan(parts, ["siglip2_g", "dino_v3"], (432, 432), 16)
    spread = balanced(report)
    assert layout_name(report) == "blocks" and layout_name(spread) == "balanced"
    assert spread.resolutions == report.resolutions and not report.partitions["low_res"].every_rank
    assert rank_counts(report, 64) == {0: 32, 32: 32}
    assert rank_counts(spread, 64) == {0: 64}
    assert spread.rank_batch_size(0) == 16 + 2


def test_the_plan_points_a_waiting_layout_at_every_rank():
    from types import SimpleNamespace

    from radio_lit.planning.layout import waiting_lines

    wait = waiting({0: 1071.0, 32: 1549.4}, {0: 32, 32: 32}, 1835.1, 84.9, 9787.0)
    ranks = [
        SimpleNamespace(rank=0, partitions=["low_res"]),
        SimpleNamespace(rank=32, partitions=["high_res"]),
    ]
    stage = SimpleNamespace(layout="blocks", waiting=wait, ranks=ranks)
    lines = waiting_lines(stage)
    assert "rank 0 (low_res) x32: 1,155.9 ms; rank 32 (high_res) x32: 1,634.3 ms" in lines[0]
    assert "24.0% of the GPU-time is ranks waiting for the slowest, 2,347 GPU-hours" in lines[1]
    assert "every_rank: true" in lines[2]
    even = waiting({0: 1310.2}, {0: 64}, 1395.1, 84.9, 7441.0)
    spread = SimpleNamespace(layout="balanced", waiting=even, ranks=ranks[:1])
    assert len(waiting_lines(spread)) == 2
