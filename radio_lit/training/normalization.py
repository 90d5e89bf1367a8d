"""The step's normalizers (docs/internals.md, "One training step" 4; PHI-S 2.2): statistics
first, then every teacher's target mapped into its normalized space, ``y' = normalizer_k(y)``,
before the matching: a head imported in its teacher's space (``model.init_from``) is composed
with a refit normalizer before it predicts (:mod:`radio_lit.export.head_spaces`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import Tensor

from radio_lit.normalizers import Normalizer
from radio_lit.normalizers import statistics as teacher_stats
from radio_lit.teachers import TeacherOutput
from radio_lit.training.matching import as_float32

__all__ = ["normalized_targets"]


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
