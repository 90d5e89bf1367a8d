"""Angle-balanced summary loss (C-RADIOv4 report 2.5, eqs. 3-7).

Cosine distance removes magnitude but not a teacher's *directional spread*: summaries of a
wide-cone teacher (DINOv3-7B, ``Disp = 2.186`` rad², report table 3) give larger cosine losses
than a narrow one (SigLIP2-g, ``0.694``) and dominate. The report divides the squared angle by
the teacher's angular dispersion::

    Θ(x, y)   = arccos(cos(x, y))                          (eq. 4)
    μ_y       = E[y] / ‖E[y]‖                              (eq. 5)
    Disp_y    = E[Θ(y, μ_y)²]                              (eq. 6)
    L(x, y)   = Θ(x, y)² / Disp_y                          (eq. 7)

so that a student predicting each teacher's mean direction has expected loss 1 for every
teacher. ``Disp_y`` is a teacher statistic (:class:`AngularDispersion`), estimated during the
stage's estimation steps like the normalizers' statistics and kept in module buffers
(checkpointed, resumed exactly), or fixed in the YAML (:class:`AngleBalanced` ``dispersion``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from radio_lit.losses.feature import Loss, _check_shapes, _per_sample_mean
from radio_lit.normalizers.base import _all_reduce, broadcast_buffers

__all__ = ["AngleBalanced", "AngularDispersion", "angle", "summary_dispersions"]

#: The smallest estimated dispersion (rad²) ``[choice]``: a teacher whose summaries all point
#: one way (a randomly initialised toy teacher) would otherwise divide by ~0.
MIN_DISPERSION = 1e-6


def angle(x: Tensor, y: Tensor) -> Tensor:
    """The angle ``Θ(x, y)`` in radians along the last dim, ``[..., C] -> [...]`` (eq. 4).

    Computed as ``atan2(‖x̂ - (x̂·ŷ)ŷ‖, x̂·ŷ)`` on unit vectors, not ``arccos``: ``arccos``'s
    derivative diverges at ``cos = ±1``, so ``Θ²`` would get a NaN gradient when the student
    matches the teacher exactly; here ``∇Θ²`` tends to 0 at ``Θ = 0`` and stays finite.
    """
    x_unit = F.normalize(x.float(), dim=-1)
    y_unit = F.normalize(y.float(), dim=-1)
    cos = (x_unit * y_unit).sum(-1)
    sin = torch.linalg.vector_norm(x_unit - cos.unsqueeze(-1) * y_unit, dim=-1)
    return torch.atan2(sin, cos)


class AngularDispersion(nn.Module):
    """One teacher's summary dispersion ``Disp_y = E[Θ(y, μ_y)²]`` (report eq. 6), streamed.

    A teacher statistic with the normalizers' lifecycle (:class:`~radio_lit.normalizers.
    Normalizer`): :meth:`update` during the estimation steps of
    :class:`~radio_lit.callbacks.TeacherStatsEstimation`, :meth:`fit`, :meth:`reset` for a new
    stage, :meth:`broadcast_state` for partitions. State in float64 buffers (in checkpoints):
    ``count``, ``direction_sum [dim]`` (sum of the unit summaries), ``angle_sum`` (sum of
    ``Θ²``), ``dispersion`` (the fit) and ``fitted``.

    ``[choice]`` The mean direction ``μ_y`` is that of the *unit-normalised* summaries
    (``Σ ŷ / ‖Σ ŷ‖``), so that a few large-magnitude summaries do not pull it. Each batch's
    ``Θ²`` is taken against the running mean direction including that batch (one pass; the
    exact ``E[Θ(y, μ_y)²]`` would need every summary kept); the bias vanishes as the mean
    direction converges (tested against a known spread).

    Args:
        dim: the teacher's summary width ``C``.
        value: a fixed dispersion (rad²) instead of an estimate, e.g. the report's table 3;
            :meth:`update`, :meth:`fit` and :meth:`reset` then keep it.
    """

    def __init__(self, dim: int, value: float | None = None) -> None:
        super().__init__()
        if value is not None and not value > 0.0:
            raise ValueError(f"a summary dispersion must be > 0 rad², got {value}")
        self.dim = dim
        self.fixed = value
        f64 = torch.float64
        self.register_buffer("count", torch.zeros((), dtype=f64))
        self.register_buffer("direction_sum", torch.zeros(dim, dtype=f64))
        self.register_buffer("angle_sum", torch.zeros((), dtype=f64))
        self.register_buffer("dispersion", torch.tensor(value or 0.0, dtype=f64))
        self.register_buffer("fitted", torch.tensor(value is not None))
        self._is_fitted = value is not None  # host copy of ``fitted``: no device sync per step
        self.process_group: dist.ProcessGroup | None = None

    @property
    def requires_statistics(self) -> bool:
        return self.fixed is None

    @property
    def is_fitted(self) -> bool:
        return self._is_fitted

    def value(self) -> Tensor:
        """``Disp_y`` (a float64 scalar on the buffers' device).

        Raises:
            RuntimeError: nothing was estimated yet (and no fixed value was given).
        """
        if not self._is_fitted:
            raise RuntimeError(
                "AngleBalanced has no summary dispersion yet: add "
                "radio_lit.callbacks.TeacherStatsEstimation to the trainer callbacks, or give "
                "it in model.summary_loss.init_args.dispersion"
            )
        return self.dispersion

    def set_process_group(self, group: dist.ProcessGroup | None, source: int = 0) -> None:
        """Pool the statistics over ``group`` (the ranks that run this teacher)."""
        self.process_group = group

    @torch.no_grad()
    def update(self, y: Tensor) -> None:
        """Add summaries ``y [..., dim]`` (all-reduced over :attr:`process_group`)."""
        if not self.requires_statistics:
            return
        with torch.autocast(device_type=y.device.type, enabled=False):
            unit = F.normalize(y.detach().reshape(-1, self.dim).to(torch.float64), dim=-1)
            sums = torch.cat([unit.new_tensor([unit.shape[0]]), unit.sum(0)])
            count, direction = _all_reduce(sums, self.process_group).split([1, self.dim])
            self.count += count[0]
            self.direction_sum += direction
            squared = angle(unit, self.direction_sum.expand_as(unit)).double().square().sum()
            self.angle_sum += _all_reduce(squared, self.process_group)

    def fit(self) -> None:
        """``Disp_y`` from everything accumulated (a fixed value stays)."""
        if not self.requires_statistics:
            return
        if self.count.item() < 2:
            raise RuntimeError(
                f"AngularDispersion.fit() needs teacher summaries, but {int(self.count.item())} "
                "were accumulated: add radio_lit.callbacks.TeacherStatsEstimation to the trainer "
                "callbacks, or give the dispersion in model.summary_loss.init_args.dispersion"
            )
        self.dispersion.copy_((self.angle_sum / self.count).clamp_min(MIN_DISPERSION))
        self.fitted.fill_(True)
        self._is_fitted = True

    def reset(self) -> None:
        """Forget the estimate (start of a new stage); a fixed value stays."""
        if self.requires_statistics:
            for buffer in self.buffers():
                buffer.zero_()
            self._is_fitted = False

    def broadcast_state(self, source: int) -> None:
        """Every buffer from global rank ``source`` to all ranks (every rank calls it)."""
        broadcast_buffers(self, source)
        self._is_fitted = bool(self.fitted)

    def diagnostics(self) -> dict[str, Tensor]:
        """``{"summary_dispersion": Disp_y}`` once fitted, for the logger."""
        return {"summary_dispersion": self.dispersion.clone()} if self._is_fitted else {}

    def spectrum(self) -> None:
        return None

    def _load_from_state_dict(
        self, state_dict: Mapping[str, Any], prefix: str, *args: Any, **kwargs: Any
    ) -> None:
        """Checkpoints written before this loss existed lack its buffers: keep the fresh
        state (estimated again, or the fixed value) instead of failing a strict load."""
        missing: list[str] = args[2]
        before = len(missing)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        names = {prefix + name for name, _ in self.named_buffers(recurse=False)}
        if not names & set(state_dict):
            del missing[before:]
        elif self.fixed is not None:  # the YAML's value wins over a checkpoint's
            self.dispersion.fill_(self.fixed)
            self.fitted.fill_(True)
        self._is_fitted = bool(self.fitted)

    def extra_repr(self) -> str:
        return f"dim={self.dim}" + (f", value={self.fixed}" if self.fixed is not None else "")


class AngleBalanced(Loss):
    """``Θ(x, y)² / Disp_y`` (report eq. 7): the summary loss of C-RADIOv4.

    The dispersion of each teacher comes from its :class:`AngularDispersion` (module buffers,
    estimated with the teacher statistics), passed as ``dispersion``; ``dispersion`` in the
    YAML fixes it per teacher instead (e.g. the report's table 3: SigLIP2-g-384 0.694,
    DINOv3-7B 2.186, DINOv3-H+ 2.120)::

        model:
          summary_loss:
            class_path: radio_lit.losses.AngleBalanced
            init_args: {dispersion: {siglip2: 0.694}}  # others: estimated

    Args:
        dispersion: fixed ``Disp_y`` (rad², > 0) per teacher name; teachers not listed are
            estimated during the estimation steps.
    """

    def __init__(self, dispersion: dict[str, float] | None = None) -> None:
        super().__init__()
        self.dispersion = dict(dispersion or {})
        for name, value in self.dispersion.items():
            if not value > 0.0 or math.isinf(value):
                raise ValueError(
                    f"model.summary_loss.init_args.dispersion: {name!r} must be a finite "
                    f"number > 0 (rad², e.g. 0.694 for SigLIP2-g), got {value}"
                )

    def forward(
        self,
        pred: Tensor,
        target: Tensor,
        per_sample: bool = False,
        dispersion: Tensor | None = None,
    ) -> Tensor:
        """``pred``, ``target``: ``[B, C]``; ``dispersion``: the teacher's ``Disp_y``."""
        _check_shapes(pred, target)
        if dispersion is None:
            raise ValueError("AngleBalanced needs the teacher's dispersion (Disp_y)")
        squared = angle(pred, target).square() / dispersion.to(torch.float32)
        return _per_sample_mean(squared) if per_sample else squared.mean()


def summary_dispersions(
    summary_dims: Mapping[str, int | None], summary_loss: nn.Module
) -> nn.ModuleDict:
    """One :class:`AngularDispersion` per teacher with a summary when ``summary_loss`` is
    :class:`AngleBalanced` (no module otherwise, so other runs' checkpoints are unchanged).

    Raises:
        ValueError: the loss fixes the dispersion of a teacher that has no summary.
    """
    if not isinstance(summary_loss, AngleBalanced):
        return nn.ModuleDict()
    unknown = sorted(set(summary_loss.dispersion) - {n for n, d in summary_dims.items() if d})
    if unknown:
        raise ValueError(
            f"model.summary_loss.init_args.dispersion names {unknown}, which are not teachers "
            f"with a summary; those are {sorted(n for n, d in summary_dims.items() if d)}"
        )
    return nn.ModuleDict(
        {
            name: AngularDispersion(dim, summary_loss.dispersion.get(name))
            for name, dim in summary_dims.items()
            if dim is not None
        }
    )
