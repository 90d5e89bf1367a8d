"""Validation and test metrics of a distillation run, per teacher and overall.

From the :class:`~radio_lit.training.matching.TeacherMatch` es a step already makes (prediction and
target in the normalizer's space, on the loss grid), each teacher's prediction and target
are mapped back to the teacher's own space with ``normalizer.inverse`` (exactly affine,
``y @ theta.T + mu``, applied in float64), as PHI-S section 4 measures every method. Keys:

- ``<teacher>/mse``: MSE in the teacher's space (PHI-S table 3; RADIOv2.5 table 3);
- ``<teacher>/fidelity`` and ``fidelity_geomean``: eq. 51 of PHI-S / eq. 8 of RADIOv2.5 and
  their geometric mean over teachers (PHI-S tables 18-19), with ``Var[Y]`` the mean of the
  per-channel variances; ``<teacher>/fidelity_global``: the same with ``Var[Y]`` the variance
  of all elements around one global mean (NVlabs/RADIO's mode-switching script);
- ``<teacher>/error_variance_range`` (normalized space) and
  ``<teacher>/error_variance_range_teacher`` (teacher space): PHI-S table 5;
- ``<teacher>/summary_cosine`` for teachers with a summary.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn
from torchmetrics import Metric
from torchmetrics.regression import MeanSquaredError

from radio_lit.metrics.features import ErrorVarianceRange, Fidelity, GlobalFidelity, SummaryCosine
from radio_lit.normalizers import Normalizer

if TYPE_CHECKING:
    from radio_lit.teachers import Teacher
    from radio_lit.training.matching import TeacherMatch

_CHUNK_ROWS = 1 << 14  # feature rows mapped to the teacher space (float64) at a time


class TeacherMetrics(nn.Module):
    """The metrics of one teacher with ``feature_dim`` channels (and a summary or not)."""

    def __init__(self, feature_dim: int, has_summary: bool) -> None:
        super().__init__()
        self.mse = MeanSquaredError().set_dtype(torch.float64)
        self.fidelity = Fidelity(feature_dim)
        self.fidelity_global = GlobalFidelity(feature_dim)
        self.error_variance_range = ErrorVarianceRange(feature_dim)
        self.error_variance_range_teacher = ErrorVarianceRange(feature_dim)
        self.summary_cosine = SummaryCosine() if has_summary else None

    def update(self, match: TeacherMatch, normalizer: Normalizer) -> None:
        """Add one batch: ``match.features`` / ``match.target`` ``[B, H, W, C]`` (normalized)."""
        dim = match.target.shape[-1]
        predictions = match.features.detach().reshape(-1, dim)
        targets = match.target.detach().reshape(-1, dim)
        for x, y in zip(predictions.split(_CHUNK_ROWS), targets.split(_CHUNK_ROWS), strict=True):
            x, y = x.double(), y.double()
            x_teacher, y_teacher = normalizer.inverse(x), normalizer.inverse(y)
            self.mse.update(x_teacher, y_teacher)
            self.fidelity.update(x_teacher, y_teacher)
            self.fidelity_global.update(x_teacher, y_teacher)
            self.error_variance_range.update(x - y)
            self.error_variance_range_teacher.update(x_teacher - y_teacher)
        if self.summary_cosine is not None and match.summary is not None:
            self.summary_cosine.update(match.summary, match.summary_target)

    def metrics(self) -> Iterator[tuple[str, Metric]]:
        """``(key, metric)`` for every metric this teacher has."""
        for key, metric in self.named_children():
            if isinstance(metric, Metric):
                yield key, metric


class DistillationMetrics(nn.Module):
    """Every teacher's :class:`TeacherMetrics`, for one stage (validation or test).

    Call :meth:`update` on every batch, :meth:`compute` at the end of the epoch (all ranks
    together: torchmetrics reduces the states across processes), then :meth:`reset`. The
    states are not part of ``state_dict()`` (torchmetrics' default), so checkpoints and
    ``init_from`` are unaffected.

    Args:
        teachers: the run's teachers by name (their ``feature_dim`` and ``summary_dim``).
    """

    def __init__(self, teachers: Mapping[str, Teacher]) -> None:
        super().__init__()
        self.teachers = nn.ModuleDict(
            {
                name: TeacherMetrics(t.feature_dim, t.summary_dim is not None)
                for name, t in teachers.items()
            }
        )

    @torch.no_grad()
    def update(
        self, matches: Mapping[str, TeacherMatch], normalizers: Mapping[str, Normalizer]
    ) -> None:
        """Add a batch's matches (any subset of the teachers)."""
        for name, match in matches.items():
            with torch.autocast(device_type=match.target.device.type, enabled=False):
                self.teachers[name].update(match, normalizers[name])

    @property
    def updated(self) -> bool:
        """Whether any batch was added since the last :meth:`reset`."""
        return any(
            metric.update_called for t in self.teachers.values() for _, metric in t.metrics()
        )

    def compute(self) -> dict[str, Tensor]:
        """``{"<teacher>/<metric>": value, ..., "fidelity_geomean": value}`` over the set.

        Every rank must call it (each metric gathers its states from all processes).
        """
        values = {
            f"{name}/{key}": metric.compute()
            for name, teacher in self.teachers.items()
            for key, metric in teacher.metrics()
        }
        fidelities = torch.stack([values[f"{name}/fidelity"] for name in self.teachers])
        values["fidelity_geomean"] = fidelities.log().mean().exp()
        return values

    def reset(self) -> None:
        for teacher in self.teachers.values():
            for _, metric in teacher.metrics():
                metric.reset()
