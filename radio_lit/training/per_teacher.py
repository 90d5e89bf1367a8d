"""Options keyed by teacher name (``model.feature_weights``, ``model.*_overrides``, ...)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from torch import nn

from radio_lit.normalizers import Normalizer
from radio_lit.teachers import Teacher


def check_names(mapping: Mapping[str, Any], teachers: Sequence[str], option: str) -> dict[str, Any]:
    """``mapping`` as a dict; raise naming ``model.<option>`` if a key is not a teacher."""
    unknown = sorted(set(mapping) - set(teachers))
    if unknown:
        raise ValueError(
            f"model.{option} names unknown teachers {unknown}; the teachers are {sorted(teachers)}"
        )
    return dict(mapping)


def per_teacher(
    weights: Mapping[str, float] | None, teachers: Sequence[str], option: str
) -> dict[str, float]:
    """Every teacher's weight from ``model.<option>`` (default 1)."""
    given = check_names(weights or {}, teachers, option)
    return {name: float(given.get(name, 1.0)) for name in teachers}


def loss_terms(
    teachers: Mapping[str, Teacher],
    feature_weights: Mapping[str, float],
    summary_weights: Mapping[str, float],
) -> dict[str, float]:
    """Every loss term ``"<teacher>/<term>"`` with its fixed weight ``gamma_k`` / ``lambda_k``
    (AM-RADIO 3.4.1), for the balancer; teachers without a summary have no summary term."""
    terms = {}
    for name, teacher in teachers.items():
        terms[f"{name}/feature_loss"] = feature_weights[name]
        if teacher.summary_dim is not None:
            terms[f"{name}/summary_loss"] = summary_weights[name]
    return terms


def teacher_normalizers(
    teachers: Mapping[str, Teacher],
    normalizer: Callable[[int], Normalizer],
    overrides: Mapping[str, Callable[[int], Normalizer]] | None,
) -> nn.ModuleDict:
    """One normalizer per teacher, of the kind ``model.normalizer`` or the teacher's entry in
    ``model.normalizer_overrides``, for its feature width (PHI-S 2.2)."""
    kinds = check_names(overrides or {}, list(teachers), "normalizer_overrides")
    return nn.ModuleDict(
        {name: kinds.get(name, normalizer)(t.feature_dim) for name, t in teachers.items()}
    )
