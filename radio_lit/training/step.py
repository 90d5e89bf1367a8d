"""What one distillation step computes, as free functions over tensors (AM-RADIO 3; PHI-S 2).

The data's way through (DESIGN.md): teachers on their own views of the crop
(:func:`run_teachers`), or their outputs read from a cached batch (:func:`teacher_outputs`),
their features moved to each loss grid (:func:`to_loss_grid`), the student's prediction of
every teacher through its adaptor heads next to the normalized target
(:func:`match_teachers`, a :class:`TeacherMatch` per teacher), and the per-teacher loss terms
(:func:`distillation_losses`), combined by the balancer (:func:`balanced_loss`).
``DistillationModule`` calls these in order; metrics and callbacks take :class:`TeacherMatch`
from here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from radio_lit.geometry.grid import GridPolicy, loss_grid, resample
from radio_lit.geometry.shifts import (
    combined_mask,
    cut_view,
    masked_loss,
    outer_view,
    resample_mask,
    to_crop_frame,
)
from radio_lit.losses import Balancer
from radio_lit.students import StudentOutput, TeacherHeads
from radio_lit.teachers import Teacher, TeacherOutput
from radio_lit.training.batch import CachedBatch
from radio_lit.training.partitions import Chunk

__all__ = [
    "TeacherMatch",
    "balanced_loss",
    "distillation_losses",
    "match_teachers",
    "run_teachers",
    "teacher_outputs",
    "to_loss_grid",
]


@dataclass
class TeacherMatch:
    """The student's prediction of one teacher next to that teacher's target.

    Attributes:
        features: ``[B, H, W, C]`` the feature head's prediction on the loss grid, in the
            normalizer's target space.
        target: ``[B, H, W, C]`` the normalized teacher features on the same grid.
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


def run_teachers(
    teachers: Mapping[str, Teacher],
    crop: Tensor,
    names: Sequence[str],
    grid: tuple[int, int],
    shifts: Mapping[str, Tensor] | None = None,
    margin: float = 0.0,
) -> dict[str, TeacherOutput]:
    """Frozen teachers ``names`` on their own views of the crop ``[B, 3, S, S]``.

    Each teacher sees its native resolution, or ``grid`` (the student's patch grid) times its
    patch size if it follows the student. The crop is resized once per distinct view size;
    each teacher then only normalizes it. Features stay on each teacher's own grid.

    With a ``margin`` (:mod:`radio_lit.geometry.shifts`), a view shows the crop's shared region,
    and a
    teacher in ``shifts`` (``[B, 2]`` whole patches of its own, on the host) its own crop of
    the image moved by its shift; its features come back in the region's frame with their
    validity.
    """
    resized: dict[tuple[int, int], Tensor] = {}
    outputs = {}
    for name in names:
        teacher = teachers[name]
        size = teacher.view_size(grid)
        if size not in resized:
            resized[size] = outer_view(crop, size, margin)
        shift = (shifts or {}).get(name)
        view = cut_view(resized[size], size, margin, shift, teacher.patch_size)
        out = teacher(view, size)
        if shift is None:
            outputs[name] = out
            continue
        tokens = (size[0] // teacher.patch_size, size[1] // teacher.patch_size)
        if tuple(out.features.shape[1:3]) != tokens:
            raise ValueError(
                f"model.shifts: teacher {name!r} returned a {tuple(out.features.shape[1:3])} "
                f"grid for a {size} px view, not view / patch size = {tokens}; its view cannot "
                "be shifted in whole patches: leave it out with "
                "model.shifts.init_args.teachers false"
            )
        features, valid = to_crop_frame(out.features, shift)
        outputs[name] = TeacherOutput(out.summary, features, valid)
    return outputs


def teacher_outputs(
    teachers: Mapping[str, Teacher], batch: object, chunk: Chunk, grid: tuple[int, int]
) -> dict[str, TeacherOutput]:
    """The outputs of ``chunk``'s teachers on its images, on each teacher's own grid: read
    from a :class:`~radio_lit.cache.CachedBatch` (the views a teacher would see at the
    student's ``grid``), or by running the live teachers on ``chunk.crop`` (:func:`run_teachers`).
    """
    if isinstance(batch, CachedBatch):
        sizes = {name: teachers[name].view_size(grid) for name in chunk.teachers}
        return batch.teacher_outputs(chunk.rows, chunk.teachers, sizes)
    if chunk.shifts is None:
        return run_teachers(teachers, chunk.crop, chunk.teachers, grid)
    shifts, margin = chunk.shifts.teachers, chunk.shifts.margin
    return run_teachers(teachers, chunk.crop, chunk.teachers, grid, shifts, margin)


def to_loss_grid(
    outputs: Mapping[str, TeacherOutput],
    teachers: Mapping[str, Teacher],
    policies: Mapping[str, GridPolicy],
    grid: tuple[int, int],
) -> dict[str, TeacherOutput]:
    """Teacher outputs with features ``[B, H, W, C]`` moved to each teacher's loss grid (grid
    policy, :mod:`radio_lit.geometry.grid`; shrinking antialiased,
    :func:`radio_lit.geometry.grid.resample`)."""
    moved = {}
    for name, out in outputs.items():
        teacher = teachers[name]
        size = loss_grid(policies[name], grid, out.features.shape[1:3], teacher.interpolatable)
        valid = None if out.valid is None else resample_mask(out.valid, size)
        moved[name] = TeacherOutput(out.summary, resample(out.features, size), valid)
    return moved


def match_teachers(
    student: StudentOutput,
    heads: Mapping[str, TeacherHeads],
    outputs: Mapping[str, TeacherOutput],
    targets: Mapping[str, Tensor],
    summary_token: Mapping[str, int],
    student_shift: Tensor | None = None,
) -> dict[str, TeacherMatch]:
    """The student's prediction of every teacher in ``outputs``, paired with its target.

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
        target = targets[name]
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


def distillation_losses(
    matches: Mapping[str, TeacherMatch],
    feature_loss: nn.Module,
    summary_loss: nn.Module,
    per_sample: bool = False,
    dispersions: Mapping[str, Tensor] | None = None,
) -> dict[str, Tensor]:
    """Per-teacher feature and summary losses, keyed ``"<teacher>/feature_loss"`` etc.

    Scalars, or ``[B]`` per image with ``per_sample`` (for the balancer). ``dispersions``:
    each teacher's summary dispersion ``Disp_y`` for an angle-balanced summary loss
    (:class:`~radio_lit.losses.AngleBalanced`, C-RADIOv4 report eq. 7).
    """
    kwargs = {"per_sample": True} if per_sample else {}
    dispersions = dispersions or {}
    losses: dict[str, Tensor] = {}
    for name, m in matches.items():
        losses[f"{name}/feature_loss"] = masked_loss(
            feature_loss, m.features, m.target, m.valid, per_sample
        )
        if m.summary is not None and m.summary_target is not None:
            scale = {"dispersion": dispersions[name]} if name in dispersions else {}
            losses[f"{name}/summary_loss"] = summary_loss(
                m.summary, m.summary_target, **kwargs, **scale
            )
    return losses


def balanced_loss(
    balancer: Balancer,
    chunks: Sequence[Chunk],
    terms: Sequence[Mapping[str, Tensor]],
    observe: bool,
) -> Tensor:
    """The step's loss: each chunk's loss terms combined by the balancer, weighted by the
    chunk's share of the update (``Chunk.weight``, :mod:`radio_lit.training.partitions`).

    With ``observe`` (training), the balancer first sees every chunk's terms once for the
    whole step (:meth:`radio_lit.losses.Balancer.observe`): one reduction per step on every
    rank, whatever its number of chunks (DESIGN.md, "Distributed rules").
    """
    if observe:
        balancer.observe(terms, [chunk.fraction for chunk in chunks])
    losses = [
        balancer(t) if chunk.weight == 1 else chunk.weight * balancer(t)
        for chunk, t in zip(chunks, terms, strict=True)
    ]
    return losses[0] if len(losses) == 1 else torch.stack(losses).sum()


def as_float32(tensor: Tensor) -> Tensor:
    """``tensor`` in float32, cast only if it is not (cached outputs may be bf16)."""
    return tensor if tensor.dtype == torch.float32 else tensor.float()
