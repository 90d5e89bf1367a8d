"""The validation metrics against their definitions (PHI-S eq. 51, tables 3 and 5), by hand."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from radio_lit.metrics import DistillationMetrics, ErrorVarianceRange, Fidelity, SummaryCosine
from radio_lit.normalizers import Identity, Standardize
from radio_lit.training.matching import TeacherMatch

# Teacher features Y [4 samples, 2 channels]: channel 0 is 0, 2, 0, 2 (mean 1, variance 1);
# channel 1 is 1, 1, 5, 5 (mean 3, variance 4), so Var[Y] = (1 + 4) / 2 = 2.5.
Y = torch.tensor([[0.0, 1.0], [2.0, 1.0], [0.0, 5.0], [2.0, 5.0]], dtype=torch.float64)
# The student is off by 1 in one channel of each sample: MSE = 4 / 8 = 0.5, F = 2.5 / 0.5 = 5.
X = Y + torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)


def test_fidelity_is_teacher_variance_over_mse_on_the_whole_set():
    fidelity = Fidelity(2)
    # Batches of 1, 2 and 1 samples, shaped [B, H, W, C]: the first alone has no variance,
    # so a mean of per-batch ratios could not give 5.
    for x, y in zip(X.split([1, 2, 1]), Y.split([1, 2, 1]), strict=True):
        fidelity.update(x.reshape(-1, 1, 1, 2), y.reshape(-1, 1, 1, 2))
    assert fidelity.compute().item() == pytest.approx(5.0, rel=1e-12)


def test_fidelity_is_one_for_a_student_that_predicts_the_teacher_mean():
    torch.manual_seed(0)
    y = torch.randn(6, 5, 5, 8) * torch.linspace(0.1, 30.0, 8) + torch.linspace(-5, 500, 8)
    fidelity = Fidelity(8)
    for batch in y.split([1, 2, 3]):
        fidelity.update(y.mean((0, 1, 2)).expand_as(batch), batch)
    assert fidelity.compute().item() == pytest.approx(1.0, rel=1e-9)


def test_error_variance_range_is_max_minus_min_channel_variance():
    # Errors: channel 0 is 1, 3, 1, 3 (variance 1), channel 1 is 0, 4, 0, 4 (variance 4).
    error = torch.tensor([[1.0, 0.0], [3.0, 4.0], [1.0, 0.0], [3.0, 4.0]])
    metric = ErrorVarianceRange(2)
    metric.update(error[:1])
    metric.update(error[1:].reshape(3, 1, 2))
    assert metric.compute().item() == pytest.approx(4.0 - 1.0)


def test_summary_cosine_is_the_mean_over_images():
    metric = SummaryCosine()
    metric.update(torch.tensor([[1.0, 0.0]]), torch.tensor([[1.0, 1.0]]))  # cos 1/sqrt(2)
    metric.update(torch.tensor([[0.0, 1.0], [3.0, 0.0]]), torch.tensor([[0.0, 2.0], [0.0, 1.0]]))
    assert metric.compute().item() == pytest.approx((1 / math.sqrt(2) + 1 + 0) / 3)


def _fitted_standardize(mean: list[float], std: list[float]) -> Standardize:
    normalizer = Standardize(len(mean))
    samples = torch.randn(4096, len(mean), generator=torch.Generator().manual_seed(1))
    normalizer.update(samples * torch.tensor(std) + torch.tensor(mean))
    normalizer.fit()
    return normalizer


def test_distillation_metrics_per_teacher_in_both_spaces():
    """Teacher "a" (Standardize): the normalized error is +-1 in channel 0 only, so the teacher
    space error is +-theta_0 there. Teacher "b" (Identity): the X/Y pair above (F = 5)."""
    a = _fitted_standardize([10.0, -3.0], [4.0, 0.5])
    theta, _ = a.affine()
    target = torch.randn(2, 3, 3, 2, generator=torch.Generator().manual_seed(2))
    sign = torch.tensor([1.0, -1.0]).repeat(9)
    error = torch.stack([sign, torch.zeros(18)], -1).reshape(2, 3, 3, 2)
    teachers = {
        "a": SimpleNamespace(feature_dim=2, summary_dim=None),
        "b": SimpleNamespace(feature_dim=2, summary_dim=2),
    }
    metrics = DistillationMetrics(teachers)
    normalizers = {"a": a, "b": Identity(2)}
    assert not metrics.updated
    metrics.update(
        {
            "a": TeacherMatch(features=target + error, target=target),
            "b": TeacherMatch(
                features=X[:2].float().reshape(1, 1, 2, 2),
                target=Y[:2].float().reshape(1, 1, 2, 2),
                summary=torch.tensor([[1.0, 0.0]]),
                summary_target=torch.tensor([[1.0, 1.0]]),
            ),
        },
        normalizers,
    )
    metrics.update(  # a batch for "b" only
        {"b": TeacherMatch(features=X[2:].float()[None, None], target=Y[2:].float()[None, None])},
        normalizers,
    )
    values = metrics.compute()
    theta0 = theta[0, 0].item()
    assert values["a/mse"].item() == pytest.approx(theta0**2 / 2, rel=1e-6)
    assert values["a/error_variance_range"].item() == pytest.approx(1.0, rel=1e-6)
    assert values["a/error_variance_range_teacher"].item() == pytest.approx(theta0**2, rel=1e-6)
    teacher_target = a.inverse(target.double())
    variance = teacher_target.reshape(-1, 2).var(0, correction=0).mean().item()
    assert values["a/fidelity"].item() == pytest.approx(variance / (theta0**2 / 2), rel=1e-6)
    assert "a/summary_cosine" not in values
    assert values["b/mse"].item() == pytest.approx(0.5)
    assert values["b/fidelity"].item() == pytest.approx(5.0)
    assert values["b/summary_cosine"].item() == pytest.approx(1 / math.sqrt(2))
    assert values["fidelity_geomean"].item() == pytest.approx(
        math.sqrt(values["a/fidelity"].item() * 5.0), rel=1e-9
    )
    assert metrics.updated
    metrics.reset()
    assert not metrics.updated


def test_fidelity_conventions_differ_by_the_spread_of_channel_means():
    """Unit-variance channels whose means spread 2 around 0 (+2, -2, +2, -2): the mean of the
    per-channel variances is 1, the variance of all elements around one global mean is
    1 + 4 = 5, so the global-mean fidelity is 5x the per-channel one."""
    from radio_lit.metrics import Fidelity, GlobalFidelity

    signs = torch.tensor([1.0, -1.0]).repeat(500)[:, None]  # exactly zero mean, unit variance
    target = signs.repeat(1, 4) + torch.tensor([2.0, -2.0, 2.0, -2.0])
    prediction = target + 1.0  # MSE 1
    per_channel, global_mean = Fidelity(4), GlobalFidelity(4)
    for metric in (per_channel, global_mean):
        metric.update(prediction, target)
    assert per_channel.compute().item() == pytest.approx(1.0)
    assert global_mean.compute().item() == pytest.approx(5.0)
