"""FixedPatternTeacher: a fixed, seeded pattern locked to the teacher's own token grid."""

from __future__ import annotations

import pytest
import torch

from radio_lit.geometry.shifts import shifted_view
from radio_lit.teachers import FixedPatternTeacher
from radio_lit.teachers.fixed_pattern import pattern_mask
from radio_lit.teachers.rescaled import calibration_features
from radio_lit.training.teachers import run_teachers
from tests.teachers.tiny import tiny_dinov3_teacher, tiny_sam_teacher, tiny_siglip_teacher


@pytest.fixture(scope="module")
def inner():
    torch.manual_seed(0)
    return tiny_dinov3_teacher(follow_student=True)  # 16 px patches, any grid


@pytest.fixture(scope="module")
def speckled(inner):
    return FixedPatternTeacher(inner, "speckle", strength=0.5, seed=7, calibration_views=1)


def _crops(count: int = 3, side: int = 96) -> torch.Tensor:
    return torch.rand(count, 3, side, side, generator=torch.Generator().manual_seed(1))


def test_features_are_the_clean_ones_plus_the_pattern_at_each_token(inner, speckled):
    crops = _crops()
    noisy, clean = speckled(crops, (96, 96)), speckled.clean(crops, (96, 96))
    assert torch.equal(clean.features, inner(crops, (96, 96)).features)
    assert torch.equal(noisy.summary, clean.summary)
    pattern = speckled.pattern((6, 6))
    assert noisy.features.shape[1:] == pattern.shape == (6, 6, inner.feature_dim)
    torch.testing.assert_close(noisy.features - clean.features, pattern.expand(3, -1, -1, -1))


def test_the_pattern_stays_on_the_teachers_grid_when_its_view_is_shifted(speckled):
    """A view shifted by k tokens: in the region's frame, token a shows pattern token a - k."""
    crops, shift = _crops(2, side=160), torch.tensor([[1, -2], [0, 1]])  # a 32 px margin
    out = run_teachers({"t": speckled}, crops, ["t"], (6, 6), {"t": shift}, margin=1 / 3)["t"]
    view = shifted_view(crops, (96, 96), 1 / 3, shift, 16)
    clean = speckled.clean(view, (96, 96)).features
    pattern = speckled.pattern((6, 6))
    for b, (dy, dx) in enumerate(shift.tolist()):
        for i in range(6):
            for j in range(6):
                if not bool(out.valid[b, i, j]):
                    continue
                expected = clean[b, i - dy, j - dx] + pattern[i - dy, j - dx]
                torch.testing.assert_close(out.features[b, i, j], expected)
    assert int(out.valid[0].sum()) == 5 * 4  # 1 row and 2 columns left the view


def test_the_patterns_energy_is_strength_squared_times_the_features_variance(inner, speckled):
    sigma = calibration_features(inner, "radio_lit:sample_images", 1, 7).std(0, correction=0)
    for kind in ("speckle", "border", "windows"):
        teacher = speckled if kind == "speckle" else None
        if teacher is None:
            teacher = FixedPatternTeacher(inner, kind, strength=0.5, seed=7, calibration_views=1)
        pattern = teacher.pattern((8, 8)).double()
        energy = pattern.square().sum(-1).mean()  # per token, over the grid
        torch.testing.assert_close(energy, 0.25 * sigma.square().sum(), rtol=1e-4, atol=0)
        carries = pattern.abs().sum(-1) > 0
        assert torch.equal(carries, pattern_mask(kind, (8, 8), band=1, window=4))


def test_the_masks_follow_the_reports_artefacts():
    border = pattern_mask("border", (6, 6), band=1, window=4)
    assert int(border.sum()) == 36 - 16 and not bool(border[1:5, 1:5].any())
    windows = pattern_mask("windows", (8, 8), band=1, window=4)
    lines = torch.zeros(8, dtype=torch.bool)
    lines[[3, 7]] = True
    assert torch.equal(windows, lines[:, None] | lines[None, :])


def test_the_pattern_is_deterministic_by_seed(inner, speckled):
    again = FixedPatternTeacher(inner, "speckle", strength=0.5, seed=7, calibration_views=1)
    other = FixedPatternTeacher(inner, "speckle", strength=0.5, seed=8, calibration_views=1)
    assert torch.equal(again.pattern((6, 6)), speckled.pattern((6, 6)))
    assert not torch.allclose(other.pattern((6, 6)), speckled.pattern((6, 6)))


def test_bad_options_are_refused_by_name(inner):
    with pytest.raises(ValueError, match="kind='stripes'"):
        FixedPatternTeacher(inner, "stripes", calibration_views=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="init_args.strength must be >= 0"):
        FixedPatternTeacher(inner, strength=-1.0, calibration_views=1)


def test_loaded_weights_bring_the_patterns_scale(inner):
    """``sigma`` travels with the teacher's weights (FeatSharp's keep_teacher_weights): a
    teacher built from other weights and loaded draws the saved teacher's pattern."""
    saved = FixedPatternTeacher(inner, kind="border", seed=4)
    other = FixedPatternTeacher(inner, kind="border", seed=4)
    other.sigma.mul_(2)
    assert not torch.equal(other.pattern((6, 6)), saved.pattern((6, 6)))
    torch.nn.Module.load_state_dict(other, {"sigma": saved.sigma}, strict=False)
    torch.testing.assert_close(other.pattern((6, 6)), saved.pattern((6, 6)), rtol=0, atol=0)


@pytest.mark.parametrize(
    "build",
    [tiny_siglip_teacher, tiny_dinov3_teacher, tiny_sam_teacher],
    ids=["open_clip", "timm", "sam"],
)
def test_built_under_another_default_device_it_calibrates_where_its_weights_are(build):
    """CPU proxy of the C-RADIOv4 ablation rows on CUDA: ``benchmarks/harness.py`` builds a run
    under ``torch.device("cuda")``, and open_clip moves its model back to the host, so the
    wrapped teacher's weights and the default device differ. Here the weights are on the host
    and the default device is ``meta``: the calibration runs on the host all the same, and the
    pattern is the one built without a default device."""
    torch.manual_seed(0)
    inner = build()
    expected = FixedPatternTeacher(inner, "windows", seed=3, calibration_views=1)
    with torch.device("meta"):
        built = FixedPatternTeacher(inner, "windows", seed=3, calibration_views=1)
        pattern = built.pattern((6, 6))
    assert built.sigma.device.type == "cpu" and pattern.device.type == "cpu"
    assert torch.equal(built.sigma, expected.sigma)
    assert torch.equal(pattern, expected.pattern((6, 6)))


@pytest.mark.parametrize(
    "build",
    [tiny_siglip_teacher, tiny_dinov3_teacher, tiny_sam_teacher],
    ids=["open_clip", "timm", "sam"],
)
def test_every_tensor_follows_a_device_move(build):
    """CPU proxy of a move to CUDA: after ``.to("meta")`` no parameter, buffer or tensor
    attribute of any submodule is left on the host."""
    torch.manual_seed(0)
    teacher = FixedPatternTeacher(build(), "border", seed=1, calibration_views=1)
    teacher.pattern((6, 6))  # a cached pattern on the host
    teacher.to("meta")
    left = [n for n, t in [*teacher.named_parameters(), *teacher.named_buffers()] if t.is_cpu]
    for prefix, module in teacher.named_modules():
        tensors = {k: v for k, v in vars(module).items() if torch.is_tensor(v)}
        left += [f"{prefix}.{k}" for k, v in tensors.items() if v.is_cpu]
    assert left == []
    assert teacher.sigma.is_meta
