"""FeatSharp's parts (radio_lit.upsamplers): the teacher's passes in one batched call, the
de-biasing buffer, the normalized space and its inverse, the base upsampler, fusion block
and downsampler shapes, the warps against kornia's matrices, the seam weights."""

from __future__ import annotations

import functools

import pytest
import torch
import torch.nn.functional as F
from kornia.geometry.transform import warp_perspective
from torch import nn

from radio_lit.upsamplers import (
    AttentionDownsampler,
    BiasBuffer,
    FeatSharp,
    FusionBlock,
    JBUStack,
    JitteredViews,
    seam_weights,
    teacher_passes,
    warp_cells,
)
from radio_lit.upsamplers.passes import cut_tiles, stitch_tiles
from tests.teachers.tiny import tiny_clip_teacher

DIM = 64  # the tiny CLIP's width: 56 px, 4x4 grid of 14 px patches


@pytest.fixture(scope="module")
def teacher():
    torch.manual_seed(0)
    return tiny_clip_teacher()


def _upsampler(factor: int = 2) -> FeatSharp:
    torch.manual_seed(0)
    fusion = functools.partial(FusionBlock, heads=2)
    return FeatSharp(DIM, (4, 4), factor=factor, fusion=fusion)


def test_the_low_resolution_and_tile_passes_are_one_batched_teacher_call(teacher, monkeypatch):
    images = torch.rand(2, 3, 112, 112)
    calls = []
    encode = teacher.encode
    monkeypatch.setattr(teacher, "encode", lambda view: calls.append(view.shape) or encode(view))
    passes = teacher_passes(teacher, images, factor=2)
    assert calls == [torch.Size([2 * (1 + 4), 3, 56, 56])]  # 1 + k² views per image, one call
    assert passes.low.shape == (2, 4, 4, DIM) and passes.tiles.shape == (2, 8, 8, DIM)
    assert passes.summary.shape == (2, teacher.summary_dim)
    # each tile of the stitched map is the teacher on that 56 px quarter of the 112 px image
    alone = teacher(images[:, :, 56:, :56], (56, 56)).features  # bottom-left tile
    torch.testing.assert_close(passes.tiles[:, 4:, :4], alone, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(passes.low, teacher(images).features, rtol=1e-4, atol=1e-4)


def test_tiles_cut_and_stitch_back():
    image = torch.arange(2 * 3 * 6 * 6, dtype=torch.float32).reshape(2, 3, 6, 6)
    tiles = cut_tiles(image, 3)
    assert tiles.shape == (18, 3, 2, 2)
    assert torch.equal(tiles[1], image[0, :, 0:2, 2:4])  # row-major: tile (0, 1)
    assert torch.equal(stitch_tiles(tiles.permute(0, 2, 3, 1), 3), image.permute(0, 2, 3, 1))


def test_the_bias_starts_at_zero_and_reaches_every_teacher_output():
    bias = BiasBuffer(8, (4, 4))
    features = torch.randn(2, 4, 4, 8)
    assert torch.equal(bias(features), features)  # zero-initialised
    with torch.no_grad():
        bias.bias.normal_()
    pattern = bias.bias.permute(1, 2, 0)
    pattern = pattern - pattern.mean((0, 1))  # a constant offset is no position-locked pattern
    torch.testing.assert_close(bias(features) - features, pattern.expand_as(features))
    tiles = bias(torch.zeros(1, 12, 12, 8), tiles=3)  # every tile gets its own copy
    for i in range(3):
        for j in range(3):
            torch.testing.assert_close(tiles[0, 4 * i : 4 * i + 4, 4 * j : 4 * j + 4], pattern)
    assert bias(torch.zeros(1, 8, 8, 8)).shape == (1, 8, 8, 8)  # another grid: resized


def test_the_output_is_in_the_normalized_space_and_its_inverse_returns(teacher):
    upsampler = _upsampler()
    features = teacher(torch.rand(4, 3, 56, 56)).features
    upsampler.normalizer.update(features)
    upsampler.normalizer.fit()
    normalized = upsampler.prepare(features).detach()  # PHI-S, bias still zero
    assert abs(float(normalized.var(dim=(0, 1, 2)).mean()) - 1) < 0.05  # PHI-S: unit variance
    torch.testing.assert_close(upsampler.denormalize(normalized), features, rtol=1e-4, atol=1e-4)


def test_featsharp_returns_the_k_times_map_and_starts_as_its_base_path(teacher):
    upsampler = _upsampler(factor=2)
    images = torch.rand(2, 3, 112, 112)
    passes = teacher_passes(teacher, images, 2)
    upsampler.normalizer.update(
        torch.cat([passes.low.reshape(-1, DIM), passes.tiles.reshape(-1, DIM)])
    )
    upsampler.normalizer.fit()
    out = upsampler(passes.low, passes.tiles, images)
    assert out.shape == (2, 8, 8, DIM)
    base = upsampler.base(upsampler.prepare(passes.low).permute(0, 3, 1, 2), images)
    # LayerScale 1e-6: the fusion block starts as the base path (notes 4.2 step 5)
    torch.testing.assert_close(out, base.permute(0, 2, 3, 1), rtol=1e-3, atol=1e-3)
    full = upsampler.upsample(teacher, images)  # the teacher's space, summary of the LR pass
    assert full.features.shape == (2, 8, 8, DIM) and torch.equal(full.summary, passes.summary)


def test_the_joint_bilateral_stack_follows_the_factor_and_averages():
    torch.manual_seed(0)
    stack = JBUStack(5, 4)
    assert [s.factor for s in stack.stages] == [2, 2]
    x, image = torch.randn(1, 5, 3, 3), torch.rand(1, 3, 50, 50)
    out = stack(x, image)
    assert out.shape == (1, 5, 12, 12)
    # weights sum to one: a constant map stays constant (the correction starts at zero)
    constant = stack(torch.full((1, 5, 3, 3), 2.5), image)
    torch.testing.assert_close(constant, torch.full_like(constant, 2.5))


def test_every_joint_bilateral_parameter_gets_a_gradient_and_old_checkpoints_load():
    # the range term depends on g(q) - g(n) only: a bias on g's last layer cancels, its
    # gradient is rounding noise that TrainingProgressGuard can find unmoved at step 0 (it
    # stopped a benchmarks/featsharp.py run of kind few-tokens); the layer has none
    torch.manual_seed(0)
    stage = JBUStack(5, 3).stages[0]
    assert stage.range_embedding[2].bias is None
    stage.correction.weight.data.normal_()
    stage(torch.randn(1, 5, 3, 3), torch.rand(1, 3, 27, 27)).square().sum().backward()
    for name, parameter in stage.named_parameters():
        assert parameter.grad.abs().max() > 1e-6, name
    saved = {**stage.state_dict(), "range_embedding.2.bias": torch.ones(32)}
    stage.load_state_dict(saved)  # a checkpoint from before (strict): the bias is dropped


def test_the_fusion_block_keeps_the_base_channels():
    torch.manual_seed(0)
    block = FusionBlock(8, heads=2, window=3, layer_scale=1.0)
    base, tiles = torch.randn(2, 5, 6, 8), torch.randn(2, 5, 6, 8)
    out = block(base, tiles)
    assert out.shape == (2, 5, 6, 8)
    out.sum().backward()
    assert block.attention.qkv.weight.grad.abs().sum() > 0
    # local attention: a token far from a change does not see it
    changed = tiles.clone()
    changed[:, 0, 0] += 10
    far = block(base, changed)[:, 4, 5] - block(base, tiles)[:, 4, 5]
    assert float(far.detach().abs().max()) == 0.0


def test_the_attention_downsampler_returns_the_teacher_grid_and_a_constant():
    torch.manual_seed(0)
    down = AttentionDownsampler(6, 3)
    x = torch.randn(2, 6, 12, 12)
    assert down(x).shape == (2, 6, 4, 4)
    down.eval()
    torch.testing.assert_close(down(torch.ones(1, 6, 12, 12)), torch.ones(1, 6, 4, 4))


def test_views_are_kornias_warps_and_feature_warps_follow_the_matrices():
    torch.manual_seed(0)
    images = torch.rand(2, 3, 64, 64)
    views, matrices = JitteredViews(count=3)(images)
    assert views.shape == (6, 3, 64, 64) and matrices.shape == (6, 3, 3)
    expected = warp_perspective(
        images.repeat_interleave(3, 0),
        matrices,
        (64, 64),
        padding_mode="reflection",
        align_corners=True,
    )
    assert torch.equal(views, expected)
    # a translation by whole 16 px cells moves the cell map by whole cells: the warped
    # features are the features (16 px averages) of the translated image
    shift = torch.eye(3).repeat(2, 1, 1)
    shift[:, 0, 2], shift[:, 1, 2] = 16.0, -32.0
    moved = warp_perspective(images, shift, (64, 64), align_corners=True)
    cells = F.avg_pool2d(images, 16)
    warped = warp_cells(cells, shift, 16.0, "zeros")
    torch.testing.assert_close(warped[..., :2, 1:], F.avg_pool2d(moved, 16)[..., :2, 1:])


def test_views_draw_kornias_transforms_without_kornias_warps():
    """The views' matrices are those kornia's own forward composes from the same generator
    state (kornia 0.9 ``AugmentationSequential.transform_matrix`` after a call), the draws
    leave the generator where that call leaves it (a resumed run's views continue), and the
    augmentations never warp the images (their warps were thrown away)."""
    views = JitteredViews(count=2)
    images = torch.rand(3, 3, 48, 48)
    torch.manual_seed(1)
    views.augment(images.repeat_interleave(2, 0))
    expected, after = views.augment.transform_matrix, torch.rand(4)
    warps = []
    for module in views.augment.children():  # RandomAffine, RandomPerspective
        module.register_forward_hook(lambda *_: warps.append(1))
    torch.manual_seed(1)
    _, matrices = views(images)
    torch.testing.assert_close(matrices, expected)
    assert torch.equal(torch.rand(4), after) and not warps


def test_seams_weigh_twice_and_average_one():
    weights = seam_weights((12, 12), 3, 2.0)
    assert abs(float(weights.mean()) - 1) < 1e-6
    assert float(weights[3, 0] / weights[1, 1]) == pytest.approx(2.0)  # tile row 0|1 seam
    assert float(weights[0, 0]) == float(weights[1, 1])  # the image border is no seam


def test_the_attention_downsampler_can_match_the_teachers_cell_average():
    """The pre-blur is narrower than a ``3 x 3`` cell average, so window weights exist that
    reproduce the teacher's own pooling (a wider blur forces the upsampler to over-sharpen)."""
    torch.manual_seed(0)
    down = AttentionDownsampler(4, 3, dropout=0.0)
    with torch.no_grad():
        down.saliency.weight.zero_()
        down.saliency.bias.zero_()
    x = torch.randn(8, 4, 24, 24)
    target = F.avg_pool2d(x, 3)
    optimizer = torch.optim.Adam([down.tap_bias], lr=0.1)
    for _ in range(200):
        error = (down(x) - target).square().mean() / target.square().mean()
        optimizer.zero_grad()
        error.backward()
        optimizer.step()
    assert float(error) < 0.1


def test_the_fusion_block_is_featsharps_mlp_and_alibi():
    """FeatSharp's code: SwiGLU from 2C to C with a nominal hidden width of 4C (2/3 of it,
    rounded up to 8), and one ALiBi slope per row/column head pair, 2^-(h // 2 + 1)."""
    block = FusionBlock(96, heads=4)
    assert block.mlp.gate_up.in_features == 192 and block.mlp.out.out_features == 96
    assert block.mlp.out.in_features == 256  # int(4 * 96 * 2 / 3) rounded up to 8
    assert block.attention.slopes.tolist() == [0.5, 0.5, 0.25, 0.25]


def test_logit_dropout_zeroes_the_content_logit_and_keeps_the_taps_bias():
    """FeatSharp's ``patches * keep_mask + logit_bias``: with every content logit dropped,
    the window weights are the softmax of the taps' biases, every tap in the map kept."""
    torch.manual_seed(0)
    down = AttentionDownsampler(4, 3, dropout=1.0)
    with torch.no_grad():
        down.tap_bias.normal_()
    x = torch.randn(2, 4, 12, 12)
    dropped = down.train()(x)
    plain = AttentionDownsampler(4, 3).eval()
    plain.load_state_dict(down.state_dict())
    with torch.no_grad():
        plain.saliency.weight.zero_()
        plain.saliency.bias.zero_()
    torch.testing.assert_close(dropped, plain(x))


def _prepass_sums(features: torch.Tensor) -> torch.Tensor:
    """``[n, h, w, C]`` -> the pre-pass sums ``[2 + C, h, w]`` (FeatSharpModule.fit_normalizer)."""
    n, h, w, _ = features.shape
    return torch.cat(
        [
            torch.full((1, h, w), float(n)),
            features.sum(0).permute(2, 0, 1),
            features.square().sum((0, 3))[None],
        ]
    ).double()


def test_prepass_bias_start_is_shrunk_by_its_standard_error() -> None:
    """A 10-batch pre-pass (40 images) plants no noise as a pattern; a strong pattern is kept."""
    from radio_lit.upsamplers.module import shrunk_locked_mean

    torch.manual_seed(0)
    noise = torch.randn(40, 4, 4, 16)
    raw = noise.mean(0) - noise.mean((0, 1, 2))
    shrunk = shrunk_locked_mean(_prepass_sums(noise), nn.Identity())
    assert shrunk.norm() < 0.25 * raw.norm()  # no pattern: mostly shrunk away
    pattern = torch.randn(4, 4, 16)
    pattern = 3 * (pattern - pattern.mean((0, 1)))
    kept = shrunk_locked_mean(_prepass_sums(noise + pattern), nn.Identity()).permute(1, 2, 0)
    assert (kept - pattern).norm() < 0.2 * pattern.norm()
