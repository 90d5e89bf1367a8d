"""Feature-grid matching: the grid on which a teacher's loss is computed (DESIGN.md step 5).

Student and teacher feature maps rarely have the same grid (a ViT/16 student at 256 px gives
16x16, a ViT/14 CLIP at 378 px gives 27x27). The papers resolve this three ways:

- ``"larger"``: AM-RADIO section 4 ("Student/Teacher Resolution Mismatch"): both maps are
  bilinearly interpolated to the larger of the two grids;
- ``"student"``: PHI-S section 3 ("downsample the teacher features to match" the 256 px
  student);
- ``"teacher"``: RADIOv2.5 section 4.2 ("We interpolate student features down to the resolution
  of the teacher's features before applying the loss function").

Growing a map is bilinear (as the papers say). Shrinking is antialiased bilinear (the triangle
filter is widened by the scale factor), so every source cell contributes to the result and, in
the backward pass, receives gradient; plain bilinear shrinking of a 64x64 map to 16x16 reads
only 25% of the cells. SAM's features are never interpolated (PHI-S 3, RADIOv2.5 4.2): a
teacher with ``interpolatable = False`` always keeps its own grid, whatever the policy.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from torch import Tensor

from radio_lit.data.views import resize_view

GridPolicy = Literal["larger", "student", "teacher"]

#: The policies, for error messages.
GRID_POLICIES: tuple[str, ...] = ("larger", "student", "teacher")


def resample(features: Tensor, size: tuple[int, int]) -> Tensor:
    """Resize a feature map ``[B, h, w, C]`` to ``[B, H, W, C]`` (differentiable).

    Each axis that grows is interpolated bilinearly (``align_corners=False``); each axis that
    shrinks is filtered with the antialiased bilinear (triangle) kernel, so every input cell
    contributes (the views' kernel, :func:`radio_lit.data.views.resize_view`: half precision
    on a CPU is resized in float32). Returns ``features`` itself when the grid already matches.
    """
    if tuple(features.shape[1:3]) == tuple(size):
        return features
    # antialias=True only widens the kernel along shrinking axes; growing axes get plain
    # bilinear weights (PyTorch's _upsample_bilinear2d_aa), so one call covers both.
    return resize_view(features.permute(0, 3, 1, 2), tuple(size)).permute(0, 2, 3, 1)


def loss_grid(
    policy: GridPolicy,
    student: tuple[int, int],
    teacher: tuple[int, int],
    interpolatable: bool = True,
) -> tuple[int, int]:
    """The ``(H, W)`` grid on which student and teacher features are compared.

    Args:
        policy: ``"larger"`` (per axis, the larger of both grids), ``"student"`` or
            ``"teacher"``.
        student: the student's feature grid ``(h, w)`` for this step.
        teacher: the teacher's feature grid ``(H, W)`` for this step.
        interpolatable: ``False`` for teachers whose features must not be resampled (SAM):
            the teacher's grid then always wins.
    """
    if not interpolatable or policy == "teacher":
        return tuple(teacher)  # type: ignore[return-value]
    if policy == "student":
        return tuple(student)  # type: ignore[return-value]
    if policy == "larger":
        return max(student[0], teacher[0]), max(student[1], teacher[1])
    raise ValueError(f"unknown grid policy {policy!r}; use one of {GRID_POLICIES}")


def check_policies(
    policy: str, overrides: Mapping[str, str], interpolatable: Mapping[str, bool]
) -> dict[str, GridPolicy]:
    """Every teacher's policy (``overrides`` replace ``policy``), validated.

    Args:
        policy: ``model.grid_policy``.
        overrides: ``model.grid_policy_overrides``, teacher name -> policy.
        interpolatable: teacher name -> whether its features may be resampled.

    Raises:
        ValueError: an unknown policy or teacher name, or an override that would resample
            a non-interpolatable teacher (SAM).
    """
    if policy not in GRID_POLICIES:
        raise ValueError(f"model.grid_policy={policy!r} is not one of {GRID_POLICIES}")
    unknown = sorted(set(overrides) - set(interpolatable))
    if unknown:
        raise ValueError(
            f"model.grid_policy_overrides names unknown teachers {unknown}; the teachers are "
            f"{sorted(interpolatable)}"
        )
    policies: dict[str, GridPolicy] = {}
    for name, can_resample in interpolatable.items():
        chosen = overrides.get(name, policy)
        if chosen not in GRID_POLICIES:
            raise ValueError(
                f"model.grid_policy_overrides.{name}={chosen!r} is not one of {GRID_POLICIES}"
            )
        if name in overrides and chosen != "teacher" and not can_resample:
            raise ValueError(
                f"model.grid_policy_overrides.{name}={chosen!r}: {name}'s features are never "
                "interpolated (PHI-S 3, RADIOv2.5 4.2: it keeps pad-and-crop or mosaic); "
                "remove the override or set it to 'teacher'"
            )
        policies[name] = chosen  # type: ignore[assignment]
    return policies


def student_input_size(resolution: int | Sequence[int], patch_size: int) -> tuple[int, int]:
    """The student's input side ``(H, W)`` from ``model.student_resolution`` (a side, or
    ``(H, W)``), checked to be a positive multiple of the student's patch size."""
    size = (resolution, resolution) if isinstance(resolution, int) else tuple(resolution)
    if len(size) != 2 or any(side <= 0 or side % patch_size for side in size):
        nearest = max(1, round(size[0] / patch_size)) * patch_size
        raise ValueError(
            f"model.student_resolution {resolution} is not a positive multiple of the "
            f"student's patch size {patch_size}; use e.g. {nearest}"
        )
    return size[0], size[1]
