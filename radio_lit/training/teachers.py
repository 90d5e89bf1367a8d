"""The step's teachers (DESIGN.md, "One training step" 3 and 5): their outputs on the loss grid.

Frozen teachers run on their own views of a chunk's crop (:func:`run_teachers`), or their
outputs are read from a cached batch (:func:`teacher_outputs`); their features then move to each
teacher's loss grid (:func:`to_loss_grid`; AM-RADIO 4, PHI-S 3, RADIOv2.5 4.2 policies).
:func:`chunk_outputs` is the three in order, for one chunk.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from torch import Tensor

from radio_lit.geometry.grid import GridPolicy, loss_grid, resample
from radio_lit.geometry.shifts import cut_view, outer_view, resample_mask, to_crop_frame
from radio_lit.teachers import Teacher, TeacherOutput
from radio_lit.training.batch import CachedBatch
from radio_lit.training.partitions import Chunk, PartitionPlan

__all__ = ["chunk_outputs", "run_teachers", "teacher_outputs", "to_loss_grid"]


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


def chunk_outputs(
    teachers: Mapping[str, Teacher],
    batch: Tensor | CachedBatch,
    chunk: Chunk,
    plan: PartitionPlan,
    policies: Mapping[str, GridPolicy],
) -> dict[str, TeacherOutput]:
    """``chunk``'s teacher outputs (live, or ``batch``'s cached ones) on each teacher's loss
    grid (``policies``), for the student's patch grid at the chunk's resolution (``plan``)."""
    grid = plan.grid(chunk.resolution)
    return to_loss_grid(teacher_outputs(teachers, batch, chunk, grid), teachers, policies, grid)
