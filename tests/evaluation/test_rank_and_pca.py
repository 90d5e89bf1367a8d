"""RankMe (PHI-S A.3) and PCA feature images (RADIO visualize_features.py)."""

from __future__ import annotations

import math

import pytest
import torch

from radio_lit.evaluation import PCAColors, PCAFeatureImages, RankMe, pca_image, rank_me
from tests.evaluation.synthetic import dataset_root, mean_color_view


def rank_r_rows(rows: int, channels: int, rank: int, seed: int = 0) -> torch.Tensor:
    """``[rows, channels]`` with ``rank`` equal nonzero singular values after centering."""
    generator = torch.Generator().manual_seed(seed)
    left = torch.randn(rows, rank, generator=generator, dtype=torch.float64)
    left, _ = torch.linalg.qr(left - left.mean(0))  # orthonormal, zero-mean columns
    right, _ = torch.linalg.qr(
        torch.randn(channels, rank, generator=generator, dtype=torch.float64)
    )
    return (left @ right.T) * 3.0 + torch.randn(channels, generator=generator, dtype=torch.float64)


def test_rankme_of_a_rank_r_matrix_is_r():
    for rank in (1, 5, 17):
        # float64 round-off puts ~1e-16 on the zero eigenvalues; their square roots count a little
        assert abs(rank_me(rank_r_rows(300, 32, rank), centered=True) - rank) < 1e-4


def test_rankme_of_unequal_singular_values_is_below_the_rank():
    rows = rank_r_rows(300, 32, 8) * torch.tensor([1.0] * 4 + [1.0] * 28, dtype=torch.float64)
    rows[:, :1] *= 10  # one dominant channel
    assert 1 < rank_me(rows) < 8


def test_rankme_callback_reports_the_summary_rank(tmp_path):
    train, _ = dataset_root(tmp_path)
    report = RankMe(str(train), crop_size=32).evaluate(mean_color_view())
    # Three colours (with small shifts) span about 2 centered directions of the 3 channels.
    assert 1.5 < report.scalars["eval/rankme_centered/backbone/summary"] <= 3.0
    assert 1.0 < report.scalars["eval/rankme/backbone/summary"] <= 3.0
    parts = {f"backbone/{p}" for p in ("summary", "features")}
    assert set(report.scalars) == {
        f"eval/{k}/{p}" for k in ("rankme", "rankme_centered") for p in parts
    }


def test_pca_image_shape_range_and_principal_direction():
    # Features vary strongly along x in direction e0, weakly along y in e1: red follows x.
    h, w, c = 6, 8, 10
    ys, xs = torch.meshgrid(torch.arange(h).float(), torch.arange(w).float(), indexing="ij")
    features = torch.zeros(h, w, c)
    features[..., 0] = 5 * xs
    features[..., 1] = ys
    rgb = pca_image(features)
    assert rgb.shape == (3, h, w)
    assert rgb.min() >= 0 and rgb.max() <= 1
    red = rgb[0]
    assert torch.all(red[:, 1:] >= red[:, :-1]) and red[0, -1] > red[0, 0]
    assert torch.equal(red[0], red[-1])  # the first component ignores y
    assert pca_image(features, (24, 32)).shape == (3, 24, 32)


def test_pca_colours_of_the_teacher_map_equal_features_to_equal_colours():
    generator = torch.Generator().manual_seed(0)
    teacher = torch.randn(4, 4, 16, generator=generator)
    colors = PCAColors.fit(teacher)
    torch.testing.assert_close(colors(teacher.clone()), colors(teacher))
    assert colors(teacher).shape == (3, 4, 4)


def test_pca_callback_logs_the_input_and_each_output():
    report = PCAFeatureImages(num_images=2, crop_size=32, display=48).evaluate(mean_color_view())
    assert set(report.images) == {
        f"eval/pca/{i}/{k}" for i in (0, 1) for k in ("input", "backbone")
    }
    for image in report.images.values():
        assert image.shape == (3, 48, 48) and image.min() >= 0 and image.max() <= 1


def test_rankme_is_uncentered_and_the_centered_rank_is_apart():
    """Garrido et al. / PHI-S table 6 take the singular values of the features themselves. Four
    orthogonal zero-mean ±1 columns of 8 rows (Sylvester Hadamard), the first shifted by 3:
    centered, four equal singular values (rank 4); uncentered, sqrt(8 + 8 * 9) and three
    sqrt(8), so exp(H(p)) with p proportional to (sqrt(80), sqrt(8), sqrt(8), sqrt(8))."""
    h2 = torch.tensor([[1.0, 1.0], [1.0, -1.0]])
    h8 = torch.kron(torch.kron(h2, h2), h2)
    rows = h8[:, 1:5].clone()
    rows[:, 0] += 3.0
    s = torch.tensor([80.0, 8.0, 8.0, 8.0], dtype=torch.float64).sqrt()
    p = s / s.sum()
    expected = math.exp(-(p * p.log()).sum().item())  # 3.413
    assert rank_me(rows) == pytest.approx(expected, rel=1e-9)
    assert rank_me(rows, centered=True) == pytest.approx(4.0, rel=1e-9)
