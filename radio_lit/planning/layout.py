"""The ranks' waiting in a planned step, and the balanced layout to compare it with
(``radio-lit plan``; issue "every rank busy").

Ranks meet at the gradients' collective, so at each resolution draw every rank waits for the
slowest one (:mod:`radio_lit.planning.plan`). With partitions on blocks of ranks (AM-RADIO 4,
C-RADIOv4's two resolution partitions) a rank of the cheaper partition idles for the
difference. Averaged over the draws, rank ``r`` computes ``w_r`` ms of the step's ``T`` ms
(collectives ``c`` included in both), so with ``n_r`` ranks of each kind out of ``N``:

    mean work  = sum_r n_r w_r / N + c
    idle share = 1 - mean work / T        (of the GPU-time: GPU-hours x idle share wait)

The balanced layout (``every_rank: true`` on every partition,
:mod:`radio_lit.training.partitions`) gives every rank ``batch_size / N`` images of each
partition, so every rank does the mean work at every draw and none waits. Packed
(``model.student_packing``, :mod:`radio_lit.students.packing`), a rank's partitions run as one
student forward: its GEMMs over all of the rank's tokens, its attention per image with the
kernel the plan counts (:func:`~radio_lit.planning.counting.packed_attention`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from radio_lit.students.packing import StudentPacking, packing_refusal

__all__ = [
    "balanced",
    "comparison",
    "compared_layouts",
    "layout_name",
    "rank_counts",
    "waiting",
    "waiting_lines",
]

#: The idle share from which the plan points at the balanced layout [choice].
IDLE_HINT = 0.05


def layout_name(partitions: Any) -> str:
    """``"balanced"`` (every partition on every rank), ``"blocks"`` (each on its block of
    ranks) or ``"mixed"``, of a :class:`~radio_lit.training.partitions.PartitionPlan`."""
    spread = {p.every_rank for p in partitions.partitions.values()}
    return "balanced" if spread == {True} else "blocks" if spread == {False} else "mixed"


def balanced(partitions: Any) -> Any:
    """The same partitions (teachers, batches, resolutions, shares: the same update) with every
    one on every rank: ``every_rank: true`` (a new plan; ``partitions`` is unchanged)."""
    spread = {n: dataclasses.replace(p, every_rank=True) for n, p in partitions.partitions.items()}
    return type(partitions)(
        spread, partitions.teachers, partitions.default_resolution, partitions.patch_size
    )


def compared_layouts(
    partitions: Any, packing: StudentPacking | None, student: Any
) -> list[tuple[Any, StudentPacking | None]]:
    """``radio-lit plan --compare-layouts``'s ``(partitions, packing)``: the configured ones,
    the balanced layout unpacked, and the balanced layout packed (the configured packing, else
    :class:`StudentPacking`'s defaults) where the student's blocks can be packed."""
    spread = balanced(partitions)
    out = [(partitions, packing), (spread, None)]
    if packing_refusal(student.blocks, training=True) is None:
        out.append((spread, packing or StudentPacking()))
    return out


def rank_counts(partitions: Any, gpus: int) -> dict[int, int]:
    """``{first rank: ranks running its partitions}`` at ``gpus`` ranks (the distinct ranks of
    :func:`~radio_lit.planning.plan.distinct_ranks`, each with how many ranks it stands for)."""
    placement = partitions.place(gpus, 0)
    firsts: dict[tuple[str, ...], int] = {}
    counts: dict[int, int] = {}
    for rank in range(gpus):
        mine = tuple(p for p, ranks in placement.ranks.items() if rank in ranks)
        first = firsts.setdefault(mine, rank)
        counts[first] = counts.get(first, 0) + 1
    return counts


def waiting(
    rank_means: Mapping[int, float],
    counts: Mapping[int, int],
    step_ms: float,
    comm_ms: float,
    gpu_hours: float | None,
) -> dict[str, Any]:
    """The module docstring's figures: per distinct rank its mean work (ms, collectives
    included) and number of ranks, the mean work over all ranks, the idle share of the step
    and the GPU-hours it costs (``None`` without ``max_steps``)."""
    gpus = sum(counts.values())
    work = {r: rank_means[r] + comm_ms for r in counts}
    mean = sum(counts[r] * work[r] for r in counts) / gpus
    share = max(0.0, 1.0 - mean / step_ms) if step_ms > 0 else 0.0
    return {
        "ranks": {r: {"count": counts[r], "mean_work_ms": work[r]} for r in counts},
        "mean_work_ms": mean,
        "idle_share": share,
        "idle_gpu_hours": None if gpu_hours is None else share * gpu_hours,
    }


def waiting_lines(stage: Any) -> list[str]:
    """The plan's lines on the waiting (``StagePlan.waiting``, its ``layout``)."""
    wait = stage.waiting
    names = {r.rank: ", ".join(r.partitions) for r in stage.ranks}
    each = "; ".join(
        f"rank {r} ({names.get(r, '?')}) x{v['count']}: {v['mean_work_ms']:,.1f} ms"
        for r, v in wait["ranks"].items()
    )
    hours = wait["idle_gpu_hours"]
    cost = "" if hours is None else f", {hours:,.0f} GPU-hours"
    lines = [
        f"layout {stage.layout}: mean work per rank (averaged over the draws, collectives "
        f"included): {each}",
        f"waiting: every rank at the mean work would step in {wait['mean_work_ms']:,.1f} ms; "
        f"{wait['idle_share']:.1%} of the GPU-time is ranks waiting for the slowest{cost}",
    ]
    if wait["idle_share"] >= IDLE_HINT and not stage.layout.startswith("balanced"):
        lines.append(
            "  every rank at the mean work: model.partitions.<name>.every_rank: true on every "
            "partition (radio-lit plan --compare-layouts prices it)"
        )
    return lines


def comparison(report: Any, *others: Any) -> str:
    """One line per layout of one stage at one GPU count, and the ratio of each other layout's
    GPU-hours (or step, without ``max_steps``) to the first's; the same calibration for all."""
    lines = [f"layouts of {report.config} at {report.gpus} x {report.gpu['name']}:"]
    for stage in (report, *others):
        hours = "" if stage.gpu_hours is None else f", {stage.gpu_hours:,.0f} GPU-hours"
        lines.append(
            f"  {stage.layout:<16} step {stage.step_ms:,.1f} ms, idle "
            f"{stage.waiting['idle_share']:.1%}{hours}"
        )
    for other in others:
        ratio = f"  {other.layout} / {report.layout}: "
        if report.gpu_hours and other.gpu_hours is not None:
            lines.append(ratio + f"{other.gpu_hours / report.gpu_hours:.2f}x the GPU-hours")
        else:
            lines.append(ratio + f"{other.step_ms / report.step_ms:.2f}x the step")
    return "\n".join(lines)
