"""The step's views (DESIGN.md, "One training step" 1-2): the batch's crop, cut into its
partitions' chunks (:class:`~radio_lit.training.partitions.PartitionPlan`: each partition's
rows, resolution and teachers), each chunk with its view shifts in training (C-RADIOv4 report
2.3.1, :mod:`radio_lit.geometry.shifts`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from radio_lit.data.views import as_float_images
from radio_lit.geometry.shifts import PatchShifts
from radio_lit.teachers import Teacher
from radio_lit.training.batch import CachedBatch, student_pixels
from radio_lit.training.partitions import Chunk, PartitionPlan
from radio_lit.training.random_streams import RankStream
from radio_lit.training.student_step import StudentStep

__all__ = ["shifted_chunks", "step_views"]


def step_views(
    batch: Tensor | CachedBatch,
    plan: PartitionPlan,
    student_step: StudentStep,
    teachers: Mapping[str, Teacher],
    train: bool,
) -> list[Chunk]:
    """The chunks of a step on ``batch`` (``[B, 3, S, S]`` uint8 crops, or a cached batch's):
    ``plan``'s partitions of the crop, in training with the view shifts of ``student_step``'s
    ``model.shifts`` drawn from its shift stream (:func:`shifted_chunks`)."""
    crop = as_float_images(student_pixels(batch))
    chunks = plan.chunks(crop, train=train)
    if not train or student_step.shifts is None:
        return chunks
    live = not isinstance(batch, CachedBatch)
    stream, patch = student_step.streams["shifts"], student_step.patch
    return shifted_chunks(chunks, student_step.shifts, stream, teachers, patch, live)


def shifted_chunks(
    chunks: Sequence[Chunk],
    shifts: PatchShifts,
    stream: RankStream,
    teachers: Mapping[str, Teacher],
    patch: int,
    live: bool = True,
) -> list[Chunk]:
    """``chunks`` with their view shifts, drawn per chunk from this rank's shift ``stream``:
    the student first, then each teacher, each within its view's margin
    (:meth:`~radio_lit.geometry.shifts.PatchShifts.chunk_shifts`; ``patch``: the student's
    patch size). Only ``live`` teachers are shifted: a cached batch holds the outputs of the
    unshifted shared region."""
    shifted = []
    for chunk in chunks:
        grid = (chunk.resolution[0] // patch, chunk.resolution[1] // patch)
        views = {
            name: (teachers[name].view_size(grid), teachers[name].patch_size)
            for name in (chunk.teachers if live else ())
        }
        with stream.active(torch.device("cpu")):
            drawn = shifts.chunk_shifts(chunk.crop.shape[0], (chunk.resolution, patch), views)
        shifted.append(dataclasses.replace(chunk, shifts=drawn))
    return shifted
