"""Output token merging (RADIOv2.5 section 4.8, table 18): merge, unmerge, and the measure."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radio_lit.evaluation import ModelView, TokenMerging
from radio_lit.evaluation.tokens import (
    merge_tokens,
    normalized_reconstruction_error,
    sink_mask,
    unmerge,
)
from radio_lit.teachers import TeacherOutput


def test_strided_sinks_are_the_top_left_of_every_cell():
    mask = sink_mask((5, 6), 2).reshape(5, 6)
    assert mask.sum() == 3 * 3
    assert mask[0, 0] and mask[2, 4] and mask[4, 2] and not mask[1, 0] and not mask[0, 5]


def test_the_most_similar_source_merges_into_its_sink_and_unmerges_to_the_mean():
    """A 1x4 grid with sinks 2 apart: sinks t0, t2; sources t1 (nearly t0) and t3 (less like
    t2). Merging to 3 tokens merges t1 into t0 (mean), keeps t3."""
    t0, t1, t2, t3 = [1.0, 0.0], [1.0, 0.1], [0.0, 1.0], [0.5, 1.0]
    grid = torch.tensor([[[t0, t1, t2, t3]]])  # [1, 1, 4, 2]
    merged, merge = merge_tokens(grid, num_tokens=3, stride=2)
    mean = [1.0, 0.05]
    torch.testing.assert_close(merged, torch.tensor([[t3, mean, t2]]))
    torch.testing.assert_close(merge.sizes, torch.tensor([[1.0, 2.0, 1.0]]))
    torch.testing.assert_close(unmerge(merged, merge), torch.tensor([[[mean, mean, t2, t3]]]))


def test_no_merging_reconstructs_exactly_and_full_merging_leaves_the_sinks():
    torch.manual_seed(0)
    features = torch.randn(2, 6, 6, 8)
    merged, merge = merge_tokens(features, num_tokens=36, stride=3)
    torch.testing.assert_close(unmerge(merged, merge), features)
    assert normalized_reconstruction_error(features, unmerge(merged, merge)).max() == 0
    merged, merge = merge_tokens(features, num_tokens=4, stride=3)
    assert merged.shape == (2, 4, 8)
    assert merge.sizes.sum(dim=1).tolist() == [36.0, 36.0]


def test_error_grows_as_fewer_tokens_remain():
    """Merging r + 1 sources merges a superset of the r most similar ones, and adding a member
    to a group never lowers its squared error about its mean: the error is monotone."""
    torch.manual_seed(0)
    smooth = F.interpolate(torch.randn(2, 16, 3, 3), size=(12, 12), mode="bilinear")
    features = smooth.permute(0, 2, 3, 1) + 0.1 * torch.randn(2, 12, 12, 16)
    errors = []
    for count in (144, 100, 64, 36, 16):
        merged, merge = merge_tokens(features, count, stride=3)
        errors.append(normalized_reconstruction_error(features, unmerge(merged, merge)))
    for more, fewer in zip(errors, errors[1:], strict=False):
        assert (fewer >= more - 1e-6).all()
    assert 0 < errors[-1].mean() < 1  # better than the mean token, worse than no merging


def test_a_token_count_below_the_sinks_is_refused_with_the_range():
    with pytest.raises(ValueError, match="choose between 9 .* and 36"):
        merge_tokens(torch.randn(1, 6, 6, 4), num_tokens=5, stride=2)


def test_the_measure_reports_the_table_18_grid(tmp_path):
    """The evaluation callback on a model whose features are a smooth function of the image:
    one scalar per (layout, count) that fits, and the markdown table."""

    def model(images):
        features = F.avg_pool2d(images, 16).permute(0, 2, 3, 1).repeat(1, 1, 1, 4)
        return {"backbone": TeacherOutput(summary=features.mean((1, 2)), features=features)}

    measure = TokenMerging(token_counts=[16, 64, 200], sink_strides=[2, 4], resolution=128)
    report = measure.evaluate(ModelView(model, (128, 128), 16))
    assert sorted(report.scalars) == sorted(
        f"eval/token_merging/backbone/sink_{s}x{s}/tokens_{m}"
        for s, m in [(2, 16), (2, 64), (4, 16), (4, 64)]
    )
    assert report.scalars["eval/token_merging/backbone/sink_2x2/tokens_64"] == 0  # no merging
    assert all(0 <= v < 1 for v in report.scalars.values())
    table = report.text["eval/token_merging/backbone"]
    assert "| sink layout | 16 tokens | 64 tokens | 200 tokens |" in table
    assert "| 4x4 |" in table and table.rstrip().endswith("- |")
