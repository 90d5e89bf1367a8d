"""What a frozen encoder returns: the type teachers, the cache and exported models share.

A leaf below every component (DESIGN.md, "Dependencies between layers"): teachers produce it,
the step consumes it, and an exported :class:`~radio_lit.export.RadioLitModel` returns one per
adaptor, so it lives beneath all three.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

__all__ = ["TeacherOutput"]


@dataclass
class TeacherOutput:
    """What a teacher returns for a batch (a plain dataclass, so Lightning can move it).

    Attributes:
        summary: ``[B, C_s]`` image-level vector, or ``None`` (SAM).
        features: ``[B, H, W, C]`` patch features on the teacher's grid.
        valid: ``[B, H, W]`` bool, the tokens that show the image when the teacher saw a
            shifted view (:mod:`radio_lit.geometry.shifts`); ``None``: every token.
    """

    summary: Tensor | None
    features: Tensor
    valid: Tensor | None = None
