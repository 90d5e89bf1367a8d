"""Toy teachers with fixed-pattern noise, for the C-RADIOv4 ablation rows (report 2.3).

The C-RADIOv4 report (2.3, notes 2.3) motivates its shift-equivariant losses with artefacts
that real teachers add at fixed positions of their own token grid, whatever the image:
SigLIP2's holes along the border, SAM's lines at its attention windows' borders, DINOv3's
speckles. A student trained with plain MSE on unshifted views learns them (they are perfectly
predictable from the token position); with independently shifted views they no longer are.
Tiny random-weight teachers have no such artefacts, so :class:`FixedPatternTeacher` adds one.

It wraps any :class:`~radio_lit.teachers.Teacher` and adds a fixed, seeded pattern
``P [H, W, C]`` to the features the wrapped teacher returns, at each token position of the
teacher's *own* output grid (of the view it was given, shifted or not): the pattern is
locked to the teacher's grid, not to the image. ``P`` is

    P[h, w, c] = strength * sigma_c * Z[h, w, c],   Z = M[h, w] * G[h, w, c],

with ``G ~ N(0, 1)`` drawn from ``seed``, ``M`` the pattern's token mask (``kind``), each
channel of ``Z`` scaled to unit mean square over the grid, and ``sigma_c`` the wrapped
teacher's per-channel standard deviation on calibration views
(:func:`~radio_lit.teachers.rescaled.calibration_features`). So, averaged over the grid, the
pattern's energy per token is ``strength^2`` times the features' variance per token
(``sum_c sigma_c^2``): ``strength`` is the pattern's RMS relative to the features' spread.

Kinds (the report's three artefacts, as token masks ``M``) [choice]:

- ``"speckle"``: every token (DINOv3's speckles: white noise over the whole grid);
- ``"border"``: the tokens within ``band`` of the grid's edge (SigLIP2's border holes);
- ``"windows"``: the last row and column of every ``window x window`` block of tokens
  (the borders of SAM's attention windows).

:meth:`FixedPatternTeacher.clean` returns the wrapped teacher's output without the pattern and
:meth:`FixedPatternTeacher.pattern` the pattern on a grid, for the probe that measures how
much of it a student reproduces (:class:`~radio_lit.evaluation.FixedPatternProbe`).
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

from radio_lit.data.image_folder import SAMPLE_IMAGES
from radio_lit.teachers.base import Teacher, TeacherOutput
from radio_lit.teachers.rescaled import calibration_features

__all__ = ["FixedPatternTeacher", "PatternKind", "pattern_mask"]

PatternKind = Literal["speckle", "border", "windows"]


def pattern_mask(kind: PatternKind, grid: tuple[int, int], band: int, window: int) -> Tensor:
    """The tokens ``[H, W]`` (bool) that carry the pattern of ``kind`` on ``grid``."""
    height, width = grid  # on the host, as the pattern's noise, whatever the default device
    rows = torch.arange(height, device="cpu")[:, None].expand(height, width)
    cols = torch.arange(width, device="cpu")[None, :].expand(height, width)
    if kind == "speckle":
        return torch.ones(height, width, dtype=torch.bool, device="cpu")
    if kind == "border":
        return (rows < band) | (cols < band) | (rows >= height - band) | (cols >= width - band)
    return (rows % window == window - 1) | (cols % window == window - 1)


class FixedPatternTeacher(Teacher):
    """A teacher whose features carry a fixed pattern locked to its own token grid.

    ``forward(crop, size)`` is the wrapped teacher's, with ``pattern(grid)`` added to its
    features ``[B, H, W, C]``; summary, resolution, patch size, pixel normalization, view
    sizes and mosaics are the wrapped teacher's (module docstring).

    Args:
        teacher: the wrapped teacher (e.g. a tiny random-weight one).
        kind: ``"speckle"``, ``"border"`` or ``"windows"`` (module docstring).
        strength: the pattern's RMS over the grid relative to the features' per-channel
            standard deviation (``strength^2``: its energy relative to their variance).
        seed: seed of the pattern (and of the calibration crops).
        band: border width in tokens (``"border"``).
        window: window side in tokens (``"windows"``).
        calibration_images: folder of the calibration images (``"radio_lit:sample_images"``).
        calibration_views: views per calibration image (a center crop plus random crops).
    """

    def __init__(
        self,
        teacher: Teacher,
        kind: PatternKind = "speckle",
        strength: float = 1.0,
        seed: int = 0,
        band: int = 1,
        window: int = 4,
        calibration_images: str = SAMPLE_IMAGES,
        calibration_views: int = 4,
    ) -> None:
        super().__init__(
            teacher.resolution,
            teacher.patch_size,
            teacher.mean,
            teacher.std,
            teacher.follow_student,
        )
        if kind not in ("speckle", "border", "windows"):
            raise ValueError(
                f"FixedPatternTeacher: kind={kind!r} is not 'speckle', 'border' or 'windows'"
            )
        if strength < 0:
            raise ValueError(
                f"FixedPatternTeacher: init_args.strength must be >= 0 (the pattern's RMS "
                f"relative to the features' std; 0: no pattern), got {strength}"
            )
        for option, value in (("band", band), ("window", window)):
            if value < 1:
                raise ValueError(
                    f"FixedPatternTeacher: init_args.{option} must be at least 1 token, got {value}"
                )
        self.teacher = teacher
        self.kind: PatternKind = kind
        self.strength = strength
        self.seed = seed
        self.band = band
        self.window = window
        self.interpolatable = teacher.interpolatable  # type: ignore[misc]
        inner = calibration_features(teacher, calibration_images, calibration_views, seed)
        sigma = inner.std(0, correction=0).float()
        # [C]; persistent, so that a teacher whose weights are saved with it (FeatSharp's
        # keep_teacher_weights) reloads the very pattern, whatever weights it was built with
        self.register_buffer("sigma", sigma)
        self._patterns: dict[tuple[int, int], Tensor] = {}
        self.register_load_state_dict_post_hook(FixedPatternTeacher._forget_patterns)
        self.freeze()

    @property
    def feature_dim(self) -> int:
        return self.teacher.feature_dim

    @property
    def summary_dim(self) -> int | None:
        return self.teacher.summary_dim

    @property
    def grid_size(self) -> tuple[int, int]:
        return self.teacher.grid_size

    def view_size(self, student_grid: tuple[int, int]) -> tuple[int, int]:
        return self.teacher.view_size(student_grid)

    def shares_canvas(self, size: tuple[int, int]) -> bool:
        return self.teacher.shares_canvas(size)

    def _forget_patterns(self, incompatible_keys: object) -> None:
        """Loaded weights bring their own ``sigma``: the patterns are drawn again."""
        self._patterns.clear()

    def pattern(self, grid: tuple[int, int]) -> Tensor:
        """The pattern ``P [H, W, C]`` (float32, on the features' device) on ``grid``;
        deterministic in ``(seed, kind, grid)``."""
        grid = (int(grid[0]), int(grid[1]))
        pattern = self._patterns.get(grid)
        if pattern is None:
            generator = torch.Generator().manual_seed(self.seed)
            noise = torch.randn(*grid, self.feature_dim, generator=generator, device="cpu")
            mask = pattern_mask(self.kind, grid, self.band, self.window)
            z = noise * mask[..., None]
            z = z / z.square().mean((0, 1)).sqrt().clamp_min(1e-12)
            pattern = z * self.sigma.cpu() * self.strength
        if pattern.device != self.sigma.device:
            pattern = pattern.to(self.sigma.device)
        self._patterns[grid] = pattern
        return pattern

    def _with_pattern(self, out: TeacherOutput) -> TeacherOutput:
        pattern = self.pattern(out.features.shape[1:3])
        features = out.features + pattern.to(out.features.dtype)
        return TeacherOutput(out.summary, features, out.valid)

    @torch.no_grad()
    def clean(self, crop: Tensor, size: tuple[int, int] | None = None) -> TeacherOutput:
        """The wrapped teacher's output for the crop ``[B, 3, h, w]``, without the pattern."""
        return self.teacher(crop, size)

    @torch.no_grad()
    def forward(self, crop: Tensor, size: tuple[int, int] | None = None) -> TeacherOutput:
        """Crop ``[B, 3, h, w]`` in ``[0, 1]`` -> the wrapped teacher's output with the pattern
        added to its features ``[B, H, W, C]`` on its own grid."""
        return self._with_pattern(self.clean(crop, size))

    def encode(self, view: Tensor) -> TeacherOutput:
        """Normalized view ``[B, 3, R, R]`` -> the wrapped teacher's output plus the pattern."""
        return self._with_pattern(self.teacher.run_encoder(view))
