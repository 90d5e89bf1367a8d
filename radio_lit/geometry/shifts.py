"""Shift-equivariant views: independently shifted crops of each model's view of one image
(C-RADIOv4 report 2.3.1; notes 2.3; DESIGN.md "Where the next parts go").

**Views.** The data's crop ``[B, 3, S, S]`` carries a margin: its centre, of side
``S / (1 + 2 margin)``, is the region every model's *unshifted* view shows, and the rest is
image content a shifted view may move into. The student and *each* live teacher get their own
crop of the image: the shared region moved by a whole number of that model's patches, drawn
independently per image and per axis (:class:`PatchShifts`). A view of ``(H, W)`` pixels is
cut from the crop resized to ``(H + 2 o_h, W + 2 o_w)``, ``o = round(margin x side)`` the
margin in that model's pixels, at offset ``o + k x patch`` (:func:`shifted_view`): whole
pixels, no resampling beyond the one resize, no fill. A shift that would need more than the
margin (``|k| x patch > o``) is rejected on that axis (0), as FeatSharp's data pipeline
rejects a jitter that would leave the image (notes 2.3, "Public code hint") ``[choice]``: the
margin is this project's, and the recipe's ``round(N(0, 0.5))`` needs ``|k| = 2`` on 0.3% of
draws per axis. Where ``o`` is not a whole pixel (``margin x side`` not an integer) the views'
regions differ by under half a pixel of that view.

**Geometry.** A view shifted by ``k`` tokens shows, at its token ``a``, the shared region's
token ``a + k`` (on that model's own grid). The student-to-teacher mapping ``F_{S→T}`` goes
through the region's frame: each map is moved back by its own integer shift on its own grid (an
exact re-indexing, :func:`to_crop_frame`, with a validity mask), and the student's map is then
resampled to the teacher's loss grid by :func:`radio_lit.geometry.grid.resample` (bilinear,
``align_corners=False``: token *centres* onto token centres, the same resampling as without
shifts). This evaluates the student's adaptor output at the teacher's token centres; it is not
a grid built from crop edges with ``align_corners=True``, which is off by ``k/N`` tokens for a
shift of ``k``. When the grids differ, a shift that is not a whole number of the other model's
tokens is interpolated by that resampling (exact when ``r_S p_T / (r_T p_S)`` makes it whole).
The loss is averaged over the overlap ``Ω`` of both views (:func:`masked_loss`); with
``margin`` 0 and no shift, everything is the unshifted path bit for bit.

**Draws and synchronisation.** Shifts are drawn and kept on the host (``[n, 2]`` CPU long
tensors): views and maps are moved by slicing with Python integers, so no shift is read back
from a device. Default distribution (RADIO #181, the recipe): ``patch x round(N(0, 0.5))`` per
axis, for the student, each teacher and the EMA view; ``uniform`` (``±max_shift``) is this
project's option.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from radio_lit.data.views import resize_view
from radio_lit.geometry.grid import resample

__all__ = [
    "ChunkShifts",
    "PatchShifts",
    "combined_mask",
    "margin_pixels",
    "masked_loss",
    "resample_mask",
    "cut_view",
    "outer_view",
    "shifted_view",
    "to_crop_frame",
]

#: A view's ``(H, W)`` pixels and its model's patch size.
ViewGeometry = tuple[tuple[int, int], int]


@dataclass
class ChunkShifts:
    """One chunk's shifts, in tokens of each model's own grid (``[n, 2]`` long, on the host:
    rows, cols), and the crop's margin they move into.

    Attributes:
        student: the student's view shift.
        teachers: each live teacher's view shift (a teacher absent here sees the unshifted
            shared region).
        margin: the crop's margin on each side, as a fraction of the shared region's side.
    """

    student: Tensor
    teachers: dict[str, Tensor] = field(default_factory=dict)
    margin: float = 0.0


def margin_pixels(size: Sequence[int], margin: float) -> tuple[int, int]:
    """The margin ``(o_h, o_w)`` in pixels of a view of ``size = (H, W)``: ``margin x side``,
    rounded half up."""
    return int(margin * size[0] + 0.5), int(margin * size[1] + 0.5)


def outer_view(crop: Tensor, size: Sequence[int], margin: float) -> Tensor:
    """The crops ``[n, 3, S, S]`` resized so that their shared region (module docstring) is
    ``size = (H, W)``: ``[n, 3, H + 2 o_h, W + 2 o_w]`` (:func:`margin_pixels`)."""
    top, left = margin_pixels(size, margin)
    return resize_view(crop, (size[0] + 2 * top, size[1] + 2 * left))


def cut_view(
    outer: Tensor, size: Sequence[int], margin: float, shift: Tensor | None, patch: int
) -> Tensor:
    """A model's view ``[n, 3, H, W]`` cut from :func:`outer_view`'s ``outer``: the shared region
    moved by ``shift [n, 2]`` whole patches of ``patch`` pixels (a host tensor; ``None``:
    unshifted); its pixel ``v`` shows the unshifted view's pixel ``v + shift x patch``. Each
    shift must lie within the margin (:meth:`PatchShifts.chunk_shifts` rejects the others)."""
    height, width = size
    top, left = margin_pixels(size, margin)
    if shift is None or not bool(shift.any()):  # a host tensor: no synchronisation
        return (
            outer if (top, left) == (0, 0) else outer[..., top : top + height, left : left + width]
        )
    rows = (top + shift[:, 0] * patch).tolist()
    cols = (left + shift[:, 1] * patch).tolist()
    if min(rows) < 0 or max(rows) > 2 * top or min(cols) < 0 or max(cols) > 2 * left:
        raise ValueError(
            f"shifts {shift.tolist()} of {patch} px patches leave the margin ({top}, {left}) px"
        )
    starts = zip(rows, cols, strict=True)
    return torch.stack(
        [outer[b, :, r : r + height, c : c + width] for b, (r, c) in enumerate(starts)]
    )


def shifted_view(
    crop: Tensor,
    size: Sequence[int],
    margin: float = 0.0,
    shift: Tensor | None = None,
    patch: int = 1,
) -> Tensor:
    """One model's view ``[n, 3, H, W]`` of the crops ``[n, 3, S, S]`` in ``[0, 1]``: the shared
    region resized to ``size``, moved by ``shift`` (:func:`outer_view`, :func:`cut_view`).
    ``margin`` 0 and no shift: the whole crop resized, as
    :func:`~radio_lit.data.views.resize_view`."""
    return cut_view(outer_view(crop, size, margin), size, margin, shift, patch)


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
        margin: the data's crop is the shared region plus this fraction of its side on each
            side (module docstring) ``[choice]``: every model's unshifted view shows the crop's
            centre ``1 / (1 + 2 margin)``, and a shift needing more than the margin is
            rejected on that axis. 0.125 holds one 16 px patch at 128 px (two from 256 px);
            set the data's ``crop_size`` to ``(1 + 2 margin)`` times the largest view's side
            to keep its pixels 1:1.

    Draws come from torch's global CPU generator; the training step makes it this rank's own
    stream (:class:`~radio_lit.training.student_step.StudentStep`, in checkpoints).
    """

    def __init__(
        self,
        distribution: Literal["gaussian", "uniform"] = "gaussian",
        std: float = 0.5,
        max_shift: int = 2,
        student: bool = True,
        teachers: bool = True,
        margin: float = 0.125,
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
        if not 0.0 <= margin <= 1.0:
            raise ValueError(
                f"model.shifts.init_args.margin={margin} must lie in [0, 1] (a fraction of the "
                "shared region's side on each side of it)"
            )
        self.distribution = distribution
        self.std = std
        self.max_shift = max_shift
        self.student = student
        self.teachers = teachers
        self.margin = margin
        self._warned: set[tuple[str, tuple[int, int]]] = set()

    @property
    def draws(self) -> bool:
        """Whether any shift is drawn (``std`` 0 and ``uniform`` ±0 draw none)."""
        spread = self.max_shift if self.distribution == "uniform" else self.std
        return spread > 0 and (self.student or self.teachers)

    def draw(self, count: int) -> Tensor:
        """``[count, 2]`` shifts in tokens (long, CPU), before any rejection."""
        if self.distribution == "uniform":
            k = self.max_shift
            return torch.randint(-k, k + 1, (count, 2))
        if self.std == 0:
            return torch.zeros(count, 2, dtype=torch.long)
        shifts = torch.round(torch.randn(count, 2) * self.std).long()
        return shifts.clamp(-self.max_shift, self.max_shift)

    def within_margin(self, shifts: Tensor, view: ViewGeometry, name: str) -> Tensor:
        """``shifts [n, 2]`` with each axis that would leave the margin of ``view`` (its size
        and patch) set to 0 (rejected); warns once per model and size that no shift fits."""
        size, patch = view
        limit = torch.tensor([o // patch for o in margin_pixels(size, self.margin)])
        if not bool(limit.any()) and (name, tuple(size)) not in self._warned and self.draws:
            self._warned.add((name, tuple(size)))
            warnings.warn(
                f"model.shifts: a margin of {self.margin} gives {name}'s {size[0]}x{size[1]} px "
                f"view {margin_pixels(size, self.margin)} px, less than its {patch} px patch: "
                "that view is never shifted (raise model.shifts.init_args.margin)",
                stacklevel=3,
            )
        return torch.where(shifts.abs() <= limit, shifts, 0)

    def chunk_shifts(
        self, count: int, student: ViewGeometry, teachers: Mapping[str, ViewGeometry]
    ) -> ChunkShifts:
        """The student's and each of ``teachers``' shifts for ``count`` images (drawn in that
        order: student, then teachers in order), each kept within its view's margin."""
        zero = torch.zeros(count, 2, dtype=torch.long)
        drawn = (
            self.within_margin(self.draw(count), student, "the student") if self.student else zero
        )
        moved = {
            name: self.within_margin(self.draw(count), view, f"teacher {name}")
            if self.teachers
            else zero
            for name, view in teachers.items()
        }
        return ChunkShifts(drawn, moved, self.margin)

    def __repr__(self) -> str:
        return (
            f"PatchShifts(distribution={self.distribution!r}, std={self.std}, "
            f"max_shift={self.max_shift}, student={self.student}, teachers={self.teachers}, "
            f"margin={self.margin})"
        )


def _translate(x: Tensor, shift: Tensor) -> tuple[Tensor, Tensor]:
    """``out[b, i, j] = x[b, i + shift[b, 0], j + shift[b, 1]]`` for ``x [n, H, W, ...]`` and
    host ``shift [n, 2]``; positions whose source lies outside are zero. Returns ``(out,
    valid [n, H, W])``. Slices of a zero-padded copy (no index tensor on the device)."""
    count, height, width = x.shape[:3]
    pad = int(shift.abs().max()) if count else 0
    if pad == 0:
        return x, torch.ones(count, height, width, dtype=torch.bool, device=x.device)
    padded = F.pad(x, (0, 0) * (x.ndim - 3) + (pad, pad, pad, pad))
    frame = torch.zeros(height + 2 * pad, width + 2 * pad, dtype=torch.bool, device=x.device)
    frame[pad : pad + height, pad : pad + width] = True
    starts = list(zip((pad + shift[:, 0]).tolist(), (pad + shift[:, 1]).tolist(), strict=True))
    # One ``unbind`` node, whose backward stacks the images' gradients once: indexing the
    # batch per image (``padded[b]``) gives each image's gradient the whole batch's size, a
    # backward quadratic in ``n``.
    images = padded.unbind(0)
    out = torch.stack(
        [image[r : r + height, c : c + width] for image, (r, c) in zip(images, starts, strict=True)]
    )
    windows = {(r, c): frame[r : r + height, c : c + width] for r, c in set(starts)}
    valid = torch.stack([windows[start] for start in starts])
    return out, valid


def to_crop_frame(features: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor]:
    """A map ``[n, H, W, C]`` of a view shifted by ``tokens [n, 2]`` (host) moved back to the
    shared region's frame (token ``a`` of the result is the region's token ``a``, on the same
    grid), with its validity ``[n, H, W]`` (bool: the view saw that token). Exact (a
    re-indexing)."""
    return _translate(features, -tokens)


def resample_mask(valid: Tensor, size: Sequence[int]) -> Tensor:
    """A validity mask ``[n, h, w]`` on the grid ``size`` as
    :func:`radio_lit.geometry.grid.resample`
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
