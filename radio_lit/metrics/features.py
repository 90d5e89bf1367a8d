"""How well the student matches one teacher: torchmetrics ``Metric`` s over a validation set.

Every metric keeps exact streaming statistics (float64 sums, reduced by torchmetrics' own
``"sum"`` state reduction across ranks), so its value over the whole validation set is the
same whatever the batching and the number of processes: never a mean of per-batch ratios.
Features are ``[..., C]``; every leading position (image, row, column) is one sample.
Variances are population variances (divided by the sample count ``N``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics import Metric
from torchmetrics.aggregation import MeanMetric

_F64 = torch.float64


def _rows(x: Tensor, channels: int) -> Tensor:
    """``[..., C]`` -> ``[N, C]`` in float64 (the metrics' exact accumulation dtype)."""
    if x.shape[-1] != channels:
        raise ValueError(
            f"the metric was built for {channels} channels, got a tensor of shape {tuple(x.shape)}"
        )
    return x.detach().reshape(-1, channels).to(_F64)


class _ChannelMoments(Metric):
    """Streaming per-channel count, sum and sum of squares of ``[..., C]`` values."""

    full_state_update = False

    def __init__(self, num_channels: int) -> None:
        super().__init__()
        if num_channels < 1:
            raise ValueError(f"num_channels must be positive, got {num_channels}")
        self.num_channels = num_channels
        self.add_state("count", torch.zeros((), dtype=_F64), dist_reduce_fx="sum")
        self.add_state("sum", torch.zeros(num_channels, dtype=_F64), dist_reduce_fx="sum")
        self.add_state("sum_sq", torch.zeros(num_channels, dtype=_F64), dist_reduce_fx="sum")

    def _accumulate(self, rows: Tensor) -> None:
        self.count += rows.shape[0]
        self.sum += rows.sum(0)
        self.sum_sq += (rows * rows).sum(0)

    def _channel_variances(self) -> Tensor:
        """Population variance of every channel, ``[C]``."""
        mean = self.sum / self.count
        return (self.sum_sq / self.count - mean * mean).clamp_min(0.0)


class ErrorVarianceRange(_ChannelMoments):
    """``max_c Var[e_c] - min_c Var[e_c]`` of the student's error ``e = x - y`` (PHI-S table 5).

    Var is each channel's variance over every sample of the set. PHI-S 4.1 reports it in the
    normalized space (where PHI-S and HCA make it nearly 0) and in the teacher's
    (denormalized) space; feed the error of the space you want to measure.

    ``update(error)``: ``error [..., C]``.
    """

    def update(self, error: Tensor) -> None:
        self._accumulate(_rows(error, self.num_channels))

    def compute(self) -> Tensor:
        variances = self._channel_variances()
        return variances.max() - variances.min()


class Fidelity(_ChannelMoments):
    """``F = Var[Y] / MSE(X, Y)`` (PHI-S appendix A.9.4, eq. 51; RADIOv2.5 4.4, eq. 8).

    ``Y`` is the teacher's feature distribution and ``X`` the student's estimate of it, both
    in the teacher's own space. ``Var[Y]`` is the variance of the teacher distribution: the
    mean over channels of each channel's variance over all samples, ``tr(Cov[Y]) / C``;
    ``MSE`` is the mean squared error over all elements. A student that always predicts the
    teacher's mean ``mu`` has ``MSE = Var[Y]``, so ``F = 1`` ("no better than sampling from
    N(mu, sigma)"); ``F > 1`` is better than that, ``F -> inf`` is a perfect match.

    ``update(prediction, target)``: both ``[..., C]`` in the teacher's space.
    """

    def __init__(self, num_channels: int) -> None:
        super().__init__(num_channels)
        self.add_state("sum_squared_error", torch.zeros((), dtype=_F64), dist_reduce_fx="sum")

    def update(self, prediction: Tensor, target: Tensor) -> None:
        if prediction.shape != target.shape:
            raise ValueError(
                f"prediction {tuple(prediction.shape)} and target {tuple(target.shape)} differ"
            )
        y = _rows(target, self.num_channels)
        error = _rows(prediction, self.num_channels) - y
        self._accumulate(y)
        self.sum_squared_error += (error * error).sum()

    def compute(self) -> Tensor:
        mse = self.sum_squared_error / (self.count * self.num_channels)
        return self._channel_variances().mean() / mse


class GlobalFidelity(Fidelity):
    """Fidelity with NVlabs/RADIO's mode-switching convention for ``Var[Y]``: the variance of
    all elements around one global mean (``Y.var()`` over every sample and channel), instead
    of :class:`Fidelity`'s mean of per-channel variances. With channel means spread apart the
    two differ several-fold (channel means spread 2, unit variances: 5x).

    ``update(prediction, target)``: both ``[..., C]`` in the teacher's space.
    """

    def compute(self) -> Tensor:
        elements = self.count * self.num_channels
        mean = self.sum.sum() / elements
        variance = (self.sum_sq.sum() / elements - mean * mean).clamp_min(0.0)
        return variance / (self.sum_squared_error / elements)


class SummaryCosine(MeanMetric):
    """Mean cosine similarity between predicted and teacher summaries over all images.

    ``update(prediction, target)``: both ``[B, C_s]``; the similarity is along the channels.
    """

    def update(self, prediction: Tensor, target: Tensor) -> None:  # type: ignore[override]
        super().update(F.cosine_similarity(prediction.float(), target.float(), dim=-1).detach())
