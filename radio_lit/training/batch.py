"""A batch of cached views: the student-side pixels and the teachers' recorded outputs.

What ``radio_lit.cache.CachedViews`` yields instead of a plain ``[B, 3, S, S]`` uint8 crop
batch. The step takes the teachers' outputs from it (:meth:`CachedBatch.teacher_outputs`)
instead of running the teachers; everything after the teachers is the same code either way
(DESIGN.md, "One training step").

Recorded outputs are keyed ``"<teacher>/<H>x<W>/features"`` (``[B, h, w, C]``, the teacher's
own grid, before normalization) and ``"<teacher>/<H>x<W>/summary"`` (``[B, C_s]``), ``H x W``
being the teacher's view size in pixels (a teacher that follows the student's grid has one
entry per student resolution the run can draw).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from radio_lit.teachers import TeacherOutput

__all__ = ["CachedBatch", "collate_views", "output_key", "student_pixels"]


def output_key(teacher: str, size: Sequence[int], part: str) -> str:
    """The key of teacher ``teacher``'s ``part`` (``features`` / ``summary``) for a view of
    ``size = (H, W)`` pixels."""
    return f"{teacher}/{size[0]}x{size[1]}/{part}"


@dataclass
class CachedBatch:
    """Cached views of ``B`` images.

    Attributes:
        pixels: ``[B, 3, S, S]`` uint8, the crops the student's view is made from.
        outputs: recorded teacher outputs keyed by :func:`output_key`, each ``[B, ...]``.
    """

    pixels: Tensor
    outputs: dict[str, Tensor]

    def __len__(self) -> int:
        return self.pixels.shape[0]

    def teacher_outputs(
        self, rows: slice, teachers: Sequence[str], sizes: Mapping[str, tuple[int, int]]
    ) -> dict[str, TeacherOutput]:
        """Outputs of ``teachers`` for the batch rows ``rows``, teacher ``k`` at the view size
        ``sizes[k]``; features ``[b, h, w, C]`` and summaries ``[b, C_s]`` as float32 (what a
        live teacher returns on CPU), or ``None`` where the teacher has no summary."""
        outputs = {}
        for name in teachers:
            key = output_key(name, sizes[name], "features")
            if key not in self.outputs:
                held = sorted({k.split("/")[1] for k in self.outputs if k.startswith(f"{name}/")})
                raise ValueError(
                    f"the cache holds teacher {name}'s views at {held} pixels, not at "
                    f"{sizes[name][0]}x{sizes[name][1]} (a student resolution the cache was "
                    "not written for): re-run radio-lit cache with this run's config"
                )
            summary = self.outputs.get(output_key(name, sizes[name], "summary"))
            outputs[name] = TeacherOutput(
                None if summary is None else summary[rows].float(),
                self.outputs[key][rows].float(),
            )
        return outputs

    def pin_memory(self) -> CachedBatch:
        """Page-locked copies, for the DataLoader's ``pin_memory``."""
        outputs = {key: value.pin_memory() for key, value in self.outputs.items()}
        return CachedBatch(self.pixels.pin_memory(), outputs)


def collate_views(items: Sequence[Mapping[str, Tensor]]) -> CachedBatch:
    """Stack the cached views ``{"pixels": [3, S, S], <output_key>: [...]}`` into a batch."""
    keys = [k for k in items[0] if k != "pixels"]
    return CachedBatch(
        torch.stack([item["pixels"] for item in items]),
        {key: torch.stack([item[key] for item in items]) for key in keys},
    )


def student_pixels(batch: Any) -> Tensor:
    """The crops ``[B, 3, S, S]`` of a training batch, cached or live."""
    return batch.pixels if isinstance(batch, CachedBatch) else batch
