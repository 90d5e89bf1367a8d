"""Shift-equivariant views: patch-quantised shifts of each model's view of the shared crop
(C-RADIOv4 report 2.3.1; notes 2.3; DESIGN.md "Where the next parts go").

From one shared crop, the student and *each* teacher see their own view, shifted by a whole
number of that model's patches, drawn independently per image and per axis. A view shifted by
``k`` tokens shows, at its token ``a``, the crop's token ``a + k`` (on that model's own grid);
what lies outside the crop is filled with the model's pixel mean and never counts.

The student-to-teacher mapping ``F_{S→T}`` is tracked exactly by going through the *crop
frame*: each map is moved back by its own integer shift on its own grid (an exact
re-indexing, :func:`to_crop_frame`, with a validity mask), and the student's map is then
resampled to the teacher's loss grid by :func:`radio_lit.grid.resample` (bilinear,
``align_corners=False``: token *centres* onto token centres, the same resampling as without
shifts). This evaluates the student's adaptor output at the teacher's token centres; it is
not a grid built from crop edges with ``align_corners=True``, which is off by ``k/N`` tokens
for a shift of ``k``. When the grids differ, a shift that is not a whole number of the other
model's tokens is interpolated by that resampling (it is exact when ``r_S p_T / (r_T p_S)``
makes it whole). The loss is averaged over the overlap ``Ω`` only (:func:`masked_loss`); a
zero shift reproduces the unshifted path bit for bit.

Default distribution (RADIO #181, the recipe): ``patch x round(N(0, 0.5))`` per axis, for the
student, each teacher and the EMA view; ``uniform`` (``±max_shift``) is this project's option.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn

from radio_lit.grid import resample

__all__ = [
    "ChunkShifts",
    "PatchShifts",
    "combined_mask",
    "masked_loss",
    "resample_mask",
    "shift_view",
    "to_crop_frame",
]


@dataclass
class ChunkShifts:
    """One chunk's shifts, in tokens of each model's own grid (``[n, 2]`` long: rows, cols).

    Attributes:
        student: the student's view shift.
        teachers: each live teacher's view shift (a teacher absent here is not shifted).
    """

    student: Tensor
    teachers: dict[str, Tensor]


class PatchShifts:
    """Draws the patch-quantised shifts of every view (``model.shifts``).

    Args:
        distribution: ``"gaussian"``: ``round(N(0, std))`` tokens per axis (RADIO #181);
            ``"uniform"``: an integer in ``[-max_shift, max_shift]`` ``[choice]``.
        std: the Gaussian's standard deviation in tokens (the recipe: 0.5); 0 shifts nothing
            and draws no random numbers.
        max_shift: the largest shift in tokens per axis ``[choice]``: Gaussian draws are
            clamped to it (with std 0.5, ``|k| > 2`` has probability below 1e-6).
        student: shift the student's view too (the recipe; ``False``: teachers only, the
            FeatSharp data pipeline's behaviour).
        teachers: shift the teachers' views (``False``: only the student's).

    Draws come from torch's global CPU generator (restored on resume by
    :class:`~radio_lit.callbacks.RandomStates`).
    """

    def __init__(
        self,
        distribution: Literal["gaussian", "uniform"] = "gaussian",
        std: float = 0.5,
        max_shift: int = 2,
        student: bool = True,
        teachers: bool = True,
    ) -> None:
        if distribution not in ("gaussian", "uniform"):
            raise ValueError(
                f"model.shifts.init_args.distribution={distribution!r} is not 'gaussian' or "
                "'uniform'"
            )
        if std < 0 or max_shift < 0:
            raise ValueError(
                f"model.shifts.init_args: std ({std}) and max_shift ({max_shift}) must be >= 0"
            )
        self.distribution = distribution
        self.std = std
        self.max_shift = max_shift
        self.student = student
        self.teachers = teachers

    def draw(self, count: int) -> Tensor:
        """``[count, 2]`` shifts in tokens (long, CPU)."""
        if self.distribution == "uniform":
            k = self.max_shift
            return torch.randint(-k, k + 1, (count, 2))
        if self.std == 0:
            return torch.zeros(count, 2, dtype=torch.long)
        shifts = torch.round(torch.randn(count, 2) * self.std).long()
        return shifts.clamp(-self.max_shift, self.max_shift)

    def chunk_shifts(
        self, count: int, teachers: Sequence[str], device: torch.device
    ) -> ChunkShifts:
        """The student's and each of ``teachers``' shifts for ``count`` images (drawn in that
        order: student, then teachers in order)."""
        zero = torch.zeros(count, 2, dtype=torch.long)
        student = self.draw(count) if self.student else zero
        drawn = {name: self.draw(count) if self.teachers else zero for name in teachers}
        return ChunkShifts(student.to(device), {name: s.to(device) for name, s in drawn.items()})

    def __repr__(self) -> str:
        return (
            f"PatchShifts(distribution={self.distribution!r}, std={self.std}, "
            f"max_shift={self.max_shift}, student={self.student}, teachers={self.teachers})"
        )


def _indices(size: int, shift: Tensor) -> tuple[Tensor, Tensor]:
    """Source indices ``[n, size]`` (``arange(size) + shift``, clamped) and their validity."""
    index = torch.arange(size, device=shift.device)[None] + shift[:, None]
    valid = (index >= 0) & (index < size)
    return index.clamp(0, size - 1), valid


def _translate(x: Tensor, shift: Tensor) -> tuple[Tensor, Tensor]:
    """``out[b, i, j] = x[b, i + shift[b, 0], j + shift[b, 1]]`` for ``x [n, H, W, ...]``;
    positions whose source lies outside are zero. Returns ``(out, valid [n, H, W])``."""
    rows, row_valid = _indices(x.shape[1], shift[:, 0])
    cols, col_valid = _indices(x.shape[2], shift[:, 1])
    batch = torch.arange(x.shape[0], device=x.device)[:, None, None]
    out = x[batch, rows[:, :, None], cols[:, None, :]]
    valid = row_valid[:, :, None] & col_valid[:, None, :]
    mask = valid.reshape(*valid.shape, *([1] * (x.ndim - 3)))
    return torch.where(mask, out, torch.zeros((), dtype=x.dtype, device=x.device)), valid


def shift_view(view: Tensor, tokens: Tensor, patch: int, fill: Sequence[float]) -> Tensor:
    """A view ``[n, 3, H, W]`` in ``[0, 1]`` shifted by ``tokens [n, 2]`` whole patches: its
    pixel ``v`` shows the unshifted view's pixel ``v + tokens * patch``; pixels from outside
    are ``fill`` (the model's pixel mean, so the normalized view is 0 there) ``[choice]``."""
    if not bool(tokens.any()):
        return view
    moved, valid = _translate(view.permute(0, 2, 3, 1), tokens * patch)
    fill_t = torch.tensor(fill, dtype=view.dtype, device=view.device)
    moved = torch.where(valid[..., None], moved, fill_t)
    return moved.permute(0, 3, 1, 2).contiguous()


def to_crop_frame(features: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """A map ``[n, H, W, C]`` of a view shifted by ``tokens [n, 2]`` moved back to the crop
    frame (token ``a`` of the result is the crop's token ``a``, on the same grid), with its
    validity ``[n, H, W]`` (bool: the view saw that token). Exact (a re-indexing)."""
    return _translate(features, -tokens)


def resample_mask(valid: Tensor, size: Sequence[int]) -> Tensor:
    """A validity mask ``[n, h, w]`` on the grid ``size`` as :func:`radio_lit.grid.resample`
    moves a map: a cell is valid only if every cell it reads from is valid."""
    if tuple(valid.shape[1:3]) == tuple(size):
        return valid
    weight = resample(valid[..., None].float(), tuple(size))[..., 0]
    return weight > 1.0 - 1e-5


def masked_loss(
    loss: nn.Module, pred: Tensor, target: Tensor, valid: Tensor | None, per_sample: bool
) -> Tensor:
    """``loss`` averaged over the valid tokens ``Ω`` only (report 2.3.1):
    ``(1/|Ω|) Σ_{u ∈ Ω} ℓ(pred(u), target(u))``, per image with ``per_sample``.

    Positions outside ``Ω`` get the target as prediction (zero error, no gradient) and the
    loss's mean is rescaled by ``|all| / |Ω|``; this holds for every position-wise loss
    whose value is 0 when prediction equals target (MSE, cosine, their hybrids, smooth L1).
    ``valid=None``: the plain loss.
    """
    kwargs = {"per_sample": True} if per_sample else {}
    if valid is None:
        return loss(pred, target, **kwargs)
    filled = torch.where(valid[..., None], pred, target.to(pred.dtype))
    value = loss(filled, target, **kwargs)
    counts = valid.flatten(1).sum(1)
    if per_sample:
        return value * (valid[0].numel() / counts.clamp_min(1))
    return value * (valid.numel() / counts.sum().clamp_min(1))


def combined_mask(*masks: Tensor | None) -> Tensor | None:
    """The intersection of the given masks (``None`` entries are all-valid)."""
    present = [m for m in masks if m is not None]
    if not present:
        return None
    out = present[0]
    for mask in present[1:]:
        out = out & mask
    return out
