"""The Normalizer contract: an invertible affine map of teacher features (PHI-S section 2.2).

A fitted normalizer maps a teacher feature ``y [C]`` to the target ``y' = W (y - mu)``
(eq. 7) and back with ``y = Θ y' + mu`` where ``Θ = W^{-1}`` (eqs. 9, 45-50). ``W`` and ``Θ``
come from the teacher's mean and covariance, streamed over the first steps of a stage.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["Normalizer"]

_CHUNK_ROWS = 1 << 16  # rows converted to float64 at a time in update()


class Normalizer(nn.Module):
    """Invertible affine normalization of ``[..., dim]`` teacher features.

    Lifecycle: :meth:`update` on teacher features during the estimation steps, :meth:`fit`
    (repeatable: it always uses everything accumulated so far), then :meth:`forward` to build
    targets and :meth:`inverse` / :meth:`affine` to return to the teacher's space;
    :meth:`reset` starts over for a new training stage (PHI-S table 10).

    All state lives in buffers, so it is saved in checkpoints and restored on resume:

    - ``count`` (float64 scalar), ``mean [dim]`` and ``m2`` (float64): the streamed sample
      count, mean and centered scatter ``Σ (y - mean)(y - mean)^T``, ``[dim, dim]``; just its
      diagonal ``[dim]`` for :attr:`elementwise` normalizers;
    - ``shift [dim]`` (mu) and ``theta`` (Θ) in float64, for the exact :meth:`affine`;
    - ``weight`` (W) in float32 for :meth:`forward`; ``[dim, dim]``, or ``[dim]`` (a diagonal)
      for elementwise normalizers;
    - ``fitted`` (bool scalar).

    Module dtype casts (``.to(torch.bfloat16)``, ``.half()``, a "-true" precision plugin) move
    these buffers across devices but keep their dtypes.

    Subclasses implement :meth:`_fit`, and may extend :meth:`_diagnostics` and :meth:`spectrum`.

    Args:
        dim: channel count ``C`` of the teacher features.
    """

    requires_statistics: ClassVar[bool] = True
    elementwise: ClassVar[bool] = False

    def __init__(self, dim: int) -> None:
        super().__init__()
        if dim < 1:
            raise ValueError(f"{type(self).__name__}: dim must be positive, got {dim}")
        self.dim = dim
        shape = (dim,) if self.elementwise else (dim, dim)
        f64 = torch.float64
        if self.requires_statistics:
            self.register_buffer("count", torch.zeros((), dtype=f64))
            self.register_buffer("mean", torch.zeros(dim, dtype=f64))
            self.register_buffer("m2", torch.zeros(shape, dtype=f64))
        self.register_buffer("fitted", torch.zeros((), dtype=torch.bool))
        self.register_buffer("shift", torch.zeros(dim, dtype=f64))
        self.register_buffer("theta", torch.zeros(shape, dtype=f64))
        self.register_buffer("weight", torch.zeros(shape, dtype=torch.float32))
        self._is_fitted = False  # host copy of ``fitted``: forward() never waits on the device
        #: The ranks whose batches the statistics pool (``None``: the whole world). Set with
        #: :meth:`set_process_group` when a teacher runs on only some ranks (partitions).
        self.process_group: dist.ProcessGroup | None = None
        self._group_source = 0

    def set_process_group(self, group: dist.ProcessGroup | None, source: int = 0) -> None:
        """Pool statistics over ``group`` only (``None``: the world).

        Args:
            group: the ranks that run this teacher (AM-RADIO 4 rank partitioning).
            source: the global rank of the group whose fitted transform every member uses.
        """
        self.process_group = group
        self._group_source = source

    # -- statistics ------------------------------------------------------------------------
    @torch.no_grad()
    def update(self, x: Tensor, mask: Tensor | None = None) -> None:
        """Accumulate the statistics of a batch of teacher features.

        Runs in float64 with autocast disabled, as an exact streaming merge (Chan et al.) of
        ``(count, mean, m2)``. Under torch.distributed every rank of :attr:`process_group`
        (default: the world) must call it together: the batch's count and sum are
        all-reduced to the group's batch mean, then its scatter around that mean, and the
        group's batch is merged in place. Every member thus holds the statistics one process
        would have on the union of the group's batches (with the world as the group, this
        also makes DDP's buffer broadcast harmless).

        Args:
            x: ``[..., dim]`` features; every leading dim is a sample (``[B, H, W, C]``
                patch features give ``B * H * W`` samples).
            mask: ``[...]`` bool, the samples to count (e.g. a shifted view's valid tokens);
                ``None``: all. The statistics are those of ``x[mask]``, computed as masked
                sums and counts: no sample count is read back to the host (a boolean index
                would be, on a GPU).
        """
        self._check_dim(x)
        if not self.requires_statistics:
            return
        if mask is not None and mask.shape != x.shape[:-1]:
            raise ValueError(
                f"{type(self).__name__}.update: the mask {tuple(mask.shape)} must have the "
                f"features' leading shape {tuple(x.shape[:-1])} (one flag per sample)"
            )
        f64 = torch.float64
        with torch.autocast(device_type=x.device.type, enabled=False):
            chunks = x.detach().reshape(-1, self.dim).split(_CHUNK_ROWS)
            weights = (
                [None] * len(chunks)
                if mask is None
                else [m[:, None] for m in mask.reshape(-1).split(_CHUNK_ROWS)]
            )
            sums = torch.zeros(self.dim + 1, dtype=f64, device=self.mean.device)
            for chunk, weight in zip(chunks, weights, strict=True):
                rows = chunk.to(sums)
                if weight is None:
                    sums[0] += chunk.shape[0]
                else:  # a masked-out row adds exact zeros
                    rows = rows * weight
                    sums[0] += weight.sum()
                sums[1:] += rows.sum(0)
            count, total = _all_reduce(sums, self.process_group).split([1, self.dim])
            mean = total / count.clamp_min(1)
            m2 = torch.zeros_like(self.m2)
            for chunk, weight in zip(chunks, weights, strict=True):
                centered = chunk.to(sums) - mean
                m2 += self._scatter(centered if weight is None else centered * weight)
            self._merge(count[0], mean, _all_reduce(m2, self.process_group))

    def _scatter(self, centered: Tensor) -> Tensor:
        """``Σ_rows c c^T`` for ``centered [N, dim]``: ``[dim, dim]``, or its diagonal."""
        return (centered * centered).sum(0) if self.elementwise else centered.T @ centered

    def _merge(self, count: Tensor, mean: Tensor, m2: Tensor) -> None:
        """Chan et al.'s pairwise merge of a batch's ``(count, mean, m2)`` into the buffers
        (without a host sync; an empty batch changes nothing)."""
        total = (self.count + count).clamp_min(1)
        delta = mean - self.mean
        self.m2 += m2 + self._scatter(delta[None]) * (self.count * count / total)
        self.mean += delta * (count / total)
        self.count += count

    def covariance(self) -> Tensor:
        """Unbiased covariance ``m2 / (count - 1)`` of what was accumulated (float64).

        Returns:
            ``[dim, dim]``, or the per-channel variances ``[dim]`` if :attr:`elementwise`.
        """
        return self.m2 / (self.count - 1)

    # -- fitting ---------------------------------------------------------------------------
    def fit(self) -> None:
        """Compute the transform from everything accumulated so far.

        Raises:
            RuntimeError: fewer than two samples were accumulated.
        """
        if not self.requires_statistics:
            return
        if self.count.item() < 2:
            raise RuntimeError(
                f"{type(self).__name__}.fit() needs teacher statistics, but "
                f"{int(self.count.item())} sample(s) were accumulated: add "
                "radio_lit.callbacks.TeacherStatsEstimation to the trainer callbacks, or call "
                "update() on teacher features before fit()."
            )
        shift, weight, theta = self._fit()
        self.shift.copy_(shift)
        self.weight.copy_(weight)
        self.theta.copy_(theta)
        # Every rank fits from identical statistics, but an eigensolver need not be bitwise
        # deterministic across devices: the group's first rank's transform is the one every
        # member uses.
        for buffer in (self.shift, self.weight, self.theta):
            _broadcast(buffer, self._group_source, self.process_group)
        self._set_fitted(True)

    def broadcast_state(self, source: int) -> None:
        """Copy every buffer (statistics and fit) from global rank ``source`` to all ranks.

        With partitions, ranks outside a teacher's group never see its features; this hands
        them the group's state (called by every rank together), so that the checkpoint rank 0
        writes holds every teacher's statistics. No-op without torch.distributed.
        """
        broadcast_buffers(self, source)
        self._is_fitted = bool(self.fitted)

    def _fit(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(mu [dim], W, Θ)`` in float64 from the statistics; shapes as the buffers."""
        raise NotImplementedError

    def reset(self) -> None:
        """Forget the statistics and the fit (start of a new training stage)."""
        if not self.requires_statistics:
            return
        for buffer in self.buffers():
            buffer.zero_()
        self._set_fitted(False)

    @property
    def is_fitted(self) -> bool:
        """Whether :meth:`forward`, :meth:`inverse` and :meth:`affine` are available."""
        return self._is_fitted

    def _set_fitted(self, value: bool) -> None:
        self.fitted.fill_(value)
        self._is_fitted = value

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._is_fitted = bool(self.fitted)

    # -- transform -------------------------------------------------------------------------
    def forward(self, x: Tensor) -> Tensor:
        """Normalize: ``y' = W (y - mu)``.

        Args:
            x: ``[..., dim]`` teacher features.

        Returns:
            ``[..., dim]`` targets in ``x``'s dtype (computed in at least float32).
        """
        return self._transform(x, lambda y: self._linear(y - _like(self.shift, y), self.weight))

    def inverse(self, y: Tensor) -> Tensor:
        """Denormalize: ``y = Θ y' + mu``, equal to ``y' @ theta.T + mu`` from :meth:`affine`.

        Args:
            y: ``[..., dim]`` values in the normalized space.

        Returns:
            ``[..., dim]`` values in the teacher's space, in ``y``'s dtype.
        """
        return self._transform(y, lambda z: self._linear(z, self.theta) + _like(self.shift, z))

    def affine(self) -> tuple[Tensor, Tensor]:
        """The exact denormalization ``(theta, mu)`` of PHI-S A.6 (eqs. 45-50), float64.

        Export folds it into the adaptor's last linear layer ``W', b'``: ``W = Θ W'``,
        ``b = Θ b' + mu`` (eqs. 42-43).

        Returns:
            ``theta [dim, dim]`` and ``mu [dim]`` with ``inverse(y) == y @ theta.T + mu``.
        """
        self._check_fitted()
        theta = self.theta.diag_embed() if self.elementwise else self.theta.clone()
        return theta, self.shift.clone()

    def _linear(self, x: Tensor, matrix: Tensor) -> Tensor:
        matrix = _like(matrix, x)
        return x * matrix if self.elementwise else F.linear(x, matrix)

    def _transform(self, x: Tensor, fn: Callable[[Tensor], Tensor]) -> Tensor:
        """Apply ``fn`` to ``x`` outside autocast, in at least float32; cast back (casts only
        where the dtype differs: float32 targets take two operations, the centring and the
        product)."""
        self._check_dim(x)
        self._check_fitted()
        with torch.autocast(device_type=x.device.type, enabled=False):
            wide = x.dtype if x.dtype in (torch.float32, torch.float64) else torch.float32
            out = fn(_like(x, wide))
        return _like(out, x.dtype)

    def _check_dim(self, x: Tensor) -> None:
        if x.ndim == 0 or x.shape[-1] != self.dim:
            raise ValueError(
                f"{type(self).__name__} was built for teacher features of dim {self.dim}, "
                f"got a tensor of shape {tuple(x.shape)} whose last dim is "
                f"{x.shape[-1] if x.ndim else 'missing'}."
            )

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise RuntimeError(
                f"{type(self).__name__} has no fitted statistics yet: add "
                "radio_lit.callbacks.TeacherStatsEstimation to the trainer callbacks, or call "
                "update() on teacher features and then fit()."
            )

    # -- logging ---------------------------------------------------------------------------
    def diagnostics(self) -> dict[str, Tensor]:
        """Scalars describing the fit, for the logger (empty before the first fit)."""
        return self._diagnostics() if self.is_fitted else {}

    def _diagnostics(self) -> dict[str, Tensor]:
        return {}

    def spectrum(self) -> Tensor | None:
        """Covariance eigenvalues ``[dim]`` (descending) of the fit, or ``None``."""
        return None

    def extra_repr(self) -> str:
        return f"dim={self.dim}"

    def _apply(self, fn: Callable[[Tensor], Tensor], recurse: bool = True) -> Normalizer:
        """Apply device moves to the buffers, but never dtype casts."""

        def keep_dtype(t: Tensor) -> Tensor:
            out = fn(t)
            return out if out.dtype == t.dtype else t.to(device=out.device)

        return super()._apply(keep_dtype, recurse)


def _like(t: Tensor, like: Tensor | torch.dtype) -> Tensor:
    """``t`` in ``like``'s dtype (and device, for a tensor), cast only if they differ."""
    dtype = like if isinstance(like, torch.dtype) else like.dtype
    device = t.device if isinstance(like, torch.dtype) else like.device
    return t if (t.dtype, t.device) == (dtype, device) else t.to(device=device, dtype=dtype)


def broadcast_buffers(module: nn.Module, source: int) -> None:
    """Copy every buffer of ``module`` from global rank ``source`` to all ranks (every rank
    calls it together); no-op without torch.distributed."""
    if not (dist.is_available() and dist.is_initialized()):
        return
    for buffer in module.buffers():
        if buffer.dtype == torch.bool:  # not every backend broadcasts bool
            flag = buffer.to(torch.uint8)
            dist.broadcast(flag, src=source)
            buffer.copy_(flag.bool())
        else:
            dist.broadcast(buffer, src=source)


def _broadcast(t: Tensor, source: int, group: dist.ProcessGroup | None) -> None:
    """Overwrite ``t`` in place with global rank ``source``'s copy, over ``group`` (``None``:
    the world), when torch.distributed is initialized."""
    if dist.is_available() and dist.is_initialized():
        dist.broadcast(t, src=source, group=group)


def _all_reduce(t: Tensor, group: dist.ProcessGroup | None = None) -> Tensor:
    """Sum ``t`` in place over ``group`` (``None``: all ranks) when torch.distributed is
    initialized."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(t, group=group)
    return t
