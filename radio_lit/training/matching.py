"""The step's matching (DESIGN.md, "One training step" 4-5): the student's prediction of every
teacher next to that teacher's target, on the loss grid (AM-RADIO 3.2; C-RADIOv4 report 2.3.1
for shifted views). Metrics and callbacks take :class:`TeacherMatch` from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch
from torch import Tensor

from radio_lit.geometry.grid import resample
from radio_lit.geometry.shifts import combined_mask, resample_mask, to_crop_frame
from radio_lit.students import StudentOutput, TeacherHeads
from radio_lit.teachers import TeacherOutput

__all__ = ["TeacherMatch", "as_float32", "match_teachers"]


@dataclass
class TeacherMatch:
    """The student's prediction of one teacher next to that teacher's target.

    Attributes:
        features: ``[B, H, W, C]`` the feature head's prediction on the loss grid, in the
            normalizer's target space.
        target: ``[B, H, W, C]`` the teacher features on the same grid: raw as matched,
            normalized by the step's normalizers before the losses.
        summary: ``[B, C_s]`` the summary head's prediction, or ``None`` (no summary).
        summary_target: ``[B, C_s]`` the teacher's summary, or ``None``.
        valid: ``[B, H, W]`` bool, the overlap ``Ω`` of shifted views (report 2.3.1) on
            which the feature loss is averaged; ``None``: every token.
    """

    features: Tensor
    target: Tensor
    summary: Tensor | None = None
    summary_target: Tensor | None = None
    valid: Tensor | None = None


def match_teachers(
    student: StudentOutput,
    heads: Mapping[str, TeacherHeads],
    outputs: Mapping[str, TeacherOutput],
    summary_token: Mapping[str, int],
    student_shift: Tensor | None = None,
    targets: Mapping[str, Tensor] | None = None,
) -> dict[str, TeacherMatch]:
    """The student's prediction of every teacher in ``outputs``, paired with its target: the
    teacher's features on the loss grid, or ``targets[k]`` where given (already normalized);
    the step's normalizers then map the targets (:mod:`radio_lit.training.normalization`).

    Teacher k's feature head maps the student's patch tokens and the map is brought to the
    target's grid (the loss grid); its summary head reads the student's summary token
    ``summary_token[k]`` (AM-RADIO 3.2). With ``student_shift`` (``[B, 2]`` tokens, the
    student saw a shifted view), the head's map is first moved back to the crop frame, and
    the match's ``valid`` is the overlap of both views (report 2.3.1,
    :mod:`radio_lit.geometry.shifts`).
    """
    matches: dict[str, TeacherMatch] = {}
    for name, out in outputs.items():
        pair = heads[name]
        target = out.features if targets is None else targets[name]
        summary = summary_target = None
        if pair.summary is not None and out.summary is not None:
            summary = pair.summary(student.summary[:, summary_token[name]])
            summary_target = as_float32(out.summary)
        features, seen = pair.features(student.features), None
        if student_shift is not None:
            features, seen = to_crop_frame(features, student_shift)
            seen = resample_mask(seen, target.shape[1:3])
        matches[name] = TeacherMatch(
            features=resample(features, target.shape[1:3]),
            target=target,
            summary=summary,
            summary_target=summary_target,
            valid=combined_mask(out.valid, seen),
        )
    return matches


def as_float32(tensor: Tensor) -> Tensor:
    """``tensor`` in float32, cast only if it is not (cached outputs may be bf16)."""
    return tensor if tensor.dtype == torch.float32 else tensor.float()
