"""The step's normalizers (DESIGN.md, "One training step" 5; PHI-S 2.2): statistics first, then
every match's target mapped into its teacher's normalized space, ``y' = normalizer_k(y)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from torch import Tensor

from radio_lit.normalizers import Normalizer
from radio_lit.normalizers import statistics as teacher_stats
from radio_lit.teachers import TeacherOutput
from radio_lit.training.matching import TeacherMatch, as_float32

__all__ = ["normalize_matches", "normalized_targets"]


def normalized_targets(
    normalizers: Mapping[str, Normalizer],
    dispersions: Mapping[str, Normalizer],
    outputs: Sequence[Mapping[str, TeacherOutput]],
    estimate: bool,
    refit: bool,
    sources: Mapping[str, int],
) -> list[dict[str, Tensor]]:
    """Targets ``[{teacher: [B, H, W, C]}]``, one mapping per chunk, from the chunks' teacher
    ``outputs`` on the loss grid. With ``estimate`` (``TeacherStatsEstimation``'s steps) the
    outputs first update the statistics
    (:func:`~radio_lit.normalizers.statistics.accumulate_outputs`; ``refit``: fit them again
    at once; ``sources``: each teacher's group)."""
    if estimate:
        teacher_stats.accumulate_outputs(normalizers, dispersions, outputs, refit, sources)
    return [{n: normalizers[n](as_float32(o.features)) for n, o in c.items()} for c in outputs]


def normalize_matches(
    matches: Sequence[Mapping[str, TeacherMatch]], targets: Sequence[Mapping[str, Tensor]]
) -> list[dict[str, TeacherMatch]]:
    """Each chunk's matches with their normalized ``targets`` in place of the raw features."""
    return [
        {n: dataclasses.replace(m, target=t[n]) for n, m in chunk.items()}
        for chunk, t in zip(matches, targets, strict=True)
    ]
