"""Which images a teacher sees together in a live run: the grouping a cache reproduces.

A teacher's output for an image can depend on the other images of its batch: a mosaic
teacher (SAM with ``mosaic``, RADIOv2.5 4.3) packs ``k x k`` views into one canvas, and SAM's
global attention mixes them (changing only a neighbour moves an image's features far beyond
rounding); any teacher's CPU kernels may round an image's outputs differently in another row or
another number of rows. So a cache holds, for each rank count it was written for, each
teacher's outputs computed on exactly the rows the live step gives it (:func:`train_places`,
:func:`val_places`), and a replay reads the outputs of its own rank count.

The grouping rule, the live step's (:meth:`radio_lit.training.partitions.PartitionPlan.chunks`),
which
the writer follows [choice: the live rule is kept; the cache records the grouping instead of
changing the step]:

- training at ``W`` ranks, per-rank batch ``B``: rank ``r``'s batch ``t`` holds the items at
  places ``(t B + j) W + r`` (``j < B``) of the epoch's order (torch's ``DistributedSampler``
  layout, :class:`~radio_lit.data.resumable.SeededSampler`; full batches only; a rank whose
  partitions use only the first ``b`` rows loads only the places ``j < b``);
- its partitions take consecutive rows of that batch (:meth:`PartitionPlan.rows`), and each
  teacher runs on its partition's rows at once; a mosaic teacher packs them ``k^2``
  consecutive rows per canvas, the last canvas's unused tiles empty (zeros);
- validation at ``W`` ranks: rank ``r`` validates places ``i W + r`` of ``val_dir``'s order
  (padded by repeating the first images, as Lightning's ``DistributedSampler`` does), ``B``
  at a time, every teacher on the whole batch.

An image's mosaic neighbours thus depend on ``W``, ``B`` and the partitions: a cache replays
exactly at the rank counts and batch size it was written for (``radio-lit cache --ranks``);
another grouping is refused for a cache with mosaic teachers (:func:`grouping_problem`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "grouped_key",
    "grouping_problem",
    "partitions_record",
    "train_places",
    "train_steps",
    "val_places",
]


def grouped_key(key: str, ranks: int) -> str:
    """The stored name of output ``key`` computed in the grouping of ``ranks`` ranks."""
    return f"{key}@{ranks}"


def train_steps(num_items: int, ranks: int, batch: int) -> int:
    """Training steps per epoch at ``ranks`` ranks of ``batch`` images (``drop_last``)."""
    return -(-num_items // ranks) // batch


def train_places(num_items: int, ranks: int, batch: int, step: int) -> list[list[int]]:
    """Per rank, the places (in the one-rank epoch order) of its batch ``step``.

    Raises ``ValueError`` if a full batch reaches the sampler's padding (``num_items`` not a
    multiple of ``ranks``, an item seen twice in the epoch): a cache holds one output per
    item and view.
    """
    steps = train_steps(num_items, ranks, batch)
    if steps * batch * ranks > num_items:
        raise ValueError(
            f"{num_items} training items over {ranks} ranks of {batch}: the sampler repeats "
            f"{steps * batch * ranks - num_items} item(s) in a full batch to pad the ranks, and "
            "a cache holds one output per item; use a rank count or batch size whose batches "
            "the items fill"
        )
    return [[(step * batch + j) * ranks + rank for j in range(batch)] for rank in range(ranks)]


def val_places(num_items: int, ranks: int, batch: int) -> list[list[list[int]]]:
    """Per rank, its validation batches as lists of item indices (``val_dir`` order; padded
    places wrap around to the first items)."""
    per_rank = -(-num_items // ranks)
    batches = []
    for rank in range(ranks):
        items = [(i * ranks + rank) % num_items for i in range(per_rank)]
        batches.append([items[s : s + batch] for s in range(0, per_rank, batch)])
    return batches


def partitions_record(plan: Any) -> dict[str, dict[str, Any]]:
    """What a partition plan groups images by: each partition's teachers, batch size and
    share of the ranks (JSON-ready)."""
    return {
        name: {
            "teachers": list(plan.members[name]),
            "batch_size": part.batch_size,
            "rank_share": float(part.rank_share),
            **({"every_rank": True} if part.every_rank else {}),  # older caches: blocks
        }
        for name, part in plan.partitions.items()
    }


def grouping_problem(
    recorded: Mapping[str, Any],
    grouped: Sequence[str],
    ranks: int,
    batch: int,
    partitions: Mapping[str, Any],
) -> str | None:
    """Why a replay at ``ranks`` ranks, batch ``batch`` and ``partitions``
    (:func:`partitions_record`) would not form the canvases the cache's mosaic teachers
    ``grouped`` were run on, or ``None`` if it does (or no teacher mixes its batch).

    ``recorded``: the manifest's grouping ``{"ranks", "batch_size", "partitions"}``.
    """
    if not grouped:
        return None
    if ranks not in recorded["ranks"]:
        what = f"{ranks} rank(s); the cache was written for {recorded['ranks']}"
    elif batch != recorded["batch_size"]:
        what = f"batch size {batch}; the cache's is {recorded['batch_size']}"
    elif list(partitions.items()) != list(recorded["partitions"].items()):  # order: rows
        what = "other model.partitions than the cache's"
    else:
        return None
    return (
        f"this run has {what}, so teacher {grouped[0]}'s mosaics would pack other images "
        "together than in the cache (mosaic features depend on their canvas neighbours): "
        f"write the cache with radio-lit cache --ranks {ranks} and this run's batch size and "
        "partitions"
    )
