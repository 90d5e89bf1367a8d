"""PatternShare: the share of a fixed pattern a student reproduces, against known values."""

from __future__ import annotations

import torch

from radio_lit.metrics import PatternShare


def _setup():
    generator = torch.Generator().manual_seed(0)
    pattern = torch.randn(4, 5, 8, generator=generator)
    clean = torch.randn(12, 4, 5, 8, generator=generator)
    noise = torch.randn(12, 4, 5, 8, generator=generator)
    return pattern, clean, noise - noise.mean(0)  # noise with a zero mean over images


def _share(pattern, estimate, clean, batches=1):
    metric = PatternShare(pattern)
    for x, y in zip(estimate.chunk(batches), clean.chunk(batches), strict=True):
        metric.update(x, y)
    return {k: v.item() for k, v in metric.compute().items()}


def test_a_student_that_copies_the_pattern_scores_one():
    pattern, clean, _ = _setup()
    values = _share(pattern, clean + pattern, clean)
    assert abs(values["pattern_share"] - 1.0) < 1e-6
    assert abs(values["clean_mse"] - pattern.double().square().mean().item()) < 1e-6


def test_a_student_that_predicts_the_clean_features_scores_zero():
    pattern, clean, _ = _setup()
    assert _share(pattern, clean, clean) == {"pattern_share": 0.0, "clean_mse": 0.0}


def test_image_dependent_errors_do_not_count_as_the_pattern():
    """Half the pattern plus errors that average out over the images: share 0.5, and the
    clean MSE adds both energies; the same in one batch or four."""
    pattern, clean, noise = _setup()
    estimate = clean + 0.5 * pattern + noise
    for batches in (1, 4):
        values = _share(pattern, estimate, clean, batches)
        assert abs(values["pattern_share"] - 0.5) < 1e-6
        expected = (0.5 * pattern + noise).double().square().mean().item()
        assert abs(values["clean_mse"] - expected) < 1e-6
