"""Shift-equivariant views (C-RADIOv4 report 2.3.1): exact geometry, overlap masks, and a
zero shift that is today's loss bit for bit."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from radio_lit.geometry.grid import resample
from radio_lit.geometry.shifts import (
    PatchShifts,
    cut_view,
    masked_loss,
    resample_mask,
    shifted_view,
    to_crop_frame,
)
from radio_lit.losses import MSE, Cosine
from tests.builders import cpu_trainer, image_batches, tiny_module


def _ramp(resolution: int, count: int, margin: int = 0) -> torch.Tensor:
    """Crops ``[count, 3, R + 2 margin, R + 2 margin]`` whose channels 0/1 are each pixel
    centre's coordinate (row, col) in units of the shared region (``[0, 1]`` inside it, the
    region being the centre ``R`` pixels); channel 2 is 0."""
    side = resolution + 2 * margin
    centres = (torch.arange(side, dtype=torch.float64) + 0.5 - margin) / resolution
    rows, cols = torch.meshgrid(centres, centres, indexing="ij")
    view = torch.stack([rows, cols, torch.zeros_like(rows)])
    return view.expand(count, -1, -1, -1).clone()


def _tokens(view: torch.Tensor, patch: int) -> torch.Tensor:
    """A shift-equivariant model: each token is its patch's mean pixel, ``[n, h, w, 3]``."""
    return F.avg_pool2d(view, patch).permute(0, 2, 3, 1)


def test_a_shifted_view_is_its_own_crop_of_the_image_with_no_fill():
    """Report 2.3.1: each model sees its own crop, shifted by whole patches into the crop's
    margin: every pixel is the image's (no grey band), and a shift leaving the margin is
    refused."""
    crop = torch.rand(2, 3, 128, 128, generator=torch.Generator().manual_seed(0))
    shift = torch.tensor([[1, -2], [0, 0]])  # 16 px patches, 32 px margin at 64 px
    view = shifted_view(crop, (64, 64), 0.5, shift, 16)
    assert torch.equal(view[0], crop[0, :, 48:112, 0:64])
    assert torch.equal(view[1], crop[1, :, 32:96, 32:96])  # the shared region, unshifted
    assert torch.equal(shifted_view(crop, (64, 64), 0.5), crop[:, :, 32:96, 32:96])
    assert torch.equal(shifted_view(crop, (128, 128)), crop)  # no margin: the whole crop
    with pytest.raises(ValueError, match="leave the margin"):
        shifted_view(crop, (64, 64), 0.5, torch.tensor([[3, 0], [0, 0]]), 16)


def test_a_map_shifted_by_k_patches_is_matched_exactly_on_the_overlap():
    """Same grid, student and teacher each on their own crop shifted by their own whole
    patches: back in the region's frame both maps agree exactly where both views saw the
    region, it is the region's own tokens, and the overlap has the expected size
    ((4 - |k_s - k_t|) per axis, minus the region's own borders)."""
    shifts = torch.tensor([[0, 0], [1, -2], [-1, 1], [2, 2]])
    teacher_shifts = torch.tensor([[0, 0], [0, 1], [-1, -1], [-2, 0]])
    generator = torch.Generator().manual_seed(0)
    crop = torch.rand(4, 3, 128, 128, generator=generator, dtype=torch.float64)
    student_view = shifted_view(crop, (64, 64), 0.5, shifts, 16)
    student, seen_s = to_crop_frame(_tokens(student_view, 16), shifts)
    teacher_view = shifted_view(crop, (64, 64), 0.5, teacher_shifts, 16)
    teacher, seen_t = to_crop_frame(_tokens(teacher_view, 16), teacher_shifts)
    overlap = seen_s & seen_t
    assert torch.equal(student[overlap], teacher[overlap])
    region = _tokens(crop[:, :, 32:96, 32:96], 16)
    assert torch.equal(student[overlap], region[overlap])
    expected = [
        (4 - max(abs(a), abs(b)) if a * b >= 0 else 4 - abs(a) - abs(b))
        for a, b in zip(shifts.flatten().tolist(), teacher_shifts.flatten().tolist(), strict=True)
    ]
    sides = torch.tensor(expected).reshape(4, 2)
    assert overlap.flatten(1).sum(1).tolist() == (sides[:, 0] * sides[:, 1]).tolist()


@pytest.mark.parametrize(
    ("student_res", "student_patch", "teacher_res", "teacher_patch"),
    [(128, 16, 56, 14), (64, 16, 112, 14), (192, 16, 64, 16)],
)
def test_token_centres_map_to_token_centres_across_grids(
    student_res, student_patch, teacher_res, teacher_patch
):
    """Different grids (SAM3's 14 px patches against the student's 16): a student whose
    tokens report their region coordinate, moved to the region's frame and resampled onto the
    teacher's grid, gives each valid interior teacher token its own centre (no k/N offset,
    which a grid from crop edges with align_corners=True would add)."""
    generator = torch.Generator().manual_seed(1)
    for _ in range(3):
        s_shift = torch.randint(-2, 3, (2, 2), generator=generator)
        t_shift = torch.randint(-2, 3, (2, 2), generator=generator)
        s_margin, t_margin = 2 * student_patch, 2 * teacher_patch
        student_view = cut_view(
            _ramp(student_res, 2, s_margin), (student_res,) * 2, s_margin / student_res,
            s_shift, student_patch,
        )  # fmt: skip
        teacher_view = cut_view(
            _ramp(teacher_res, 2, t_margin), (teacher_res,) * 2, t_margin / teacher_res,
            t_shift, teacher_patch,
        )  # fmt: skip
        student, seen_s = to_crop_frame(_tokens(student_view, student_patch), s_shift)
        teacher, seen_t = to_crop_frame(_tokens(teacher_view, teacher_patch), t_shift)
        grid = teacher.shape[1:3]
        pred = resample(student, grid)
        valid = resample_mask(seen_s, grid) & seen_t
        interior = valid.clone()  # away from the map's outer border (clamped interpolation)
        interior[:, [0, -1]] = False
        interior[:, :, [0, -1]] = False
        assert interior.any()
        torch.testing.assert_close(pred[interior][:, :2], teacher[interior][:, :2])
        unshifted = _tokens(_ramp(teacher_res, 2), teacher_patch)
        assert torch.equal(teacher[seen_t][:, :2], unshifted[seen_t][:, :2])


def test_a_shifted_student_predicts_what_the_unshifted_one_does_on_the_overlap():
    """Shrinking by a non-integer factor (6x6 -> 4x4, antialiased as without shifts): the
    shifted student's prediction on the overlap is the unshifted student's, exactly."""
    crop = torch.rand(3, 3, 128, 128, generator=torch.Generator().manual_seed(4))
    shift = torch.tensor([[1, 0], [-1, 1], [0, 0]])
    unshifted = resample(_tokens(crop[:, :, 16:112, 16:112], 16), (4, 4))
    view = cut_view(crop, (96, 96), 1 / 6, shift, 16)  # a 16 px margin
    moved, seen = to_crop_frame(_tokens(view, 16), shift)
    valid = resample_mask(seen, (4, 4))
    assert valid.any() and not valid[:2].all() and valid[2].all()
    assert torch.equal(resample(moved, (4, 4))[valid], unshifted[valid])


class _Allocated(TorchDispatchMode):
    """Elements of the tensors the operations run under it allocate (views left out)."""

    def __init__(self) -> None:
        super().__init__()
        self.elements = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        given = {
            t.untyped_storage().data_ptr()
            for t in tree_leaves((args, kwargs))
            if isinstance(t, torch.Tensor)
        }
        self.elements += sum(
            t.numel()
            for t in tree_leaves(out)
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given
        )
        return out


@pytest.mark.parametrize("count", [8, 64])
def test_moving_a_student_map_back_costs_its_backward_the_maps_size_not_the_batchs_square(
    count,
):
    """The student's map is moved back with gradients (grid matching, the EMA loss): the
    backward's tensors stay a few maps' size, however many images a rank holds (a gradient
    per image as large as the batch made C-RADIOv4's 256-image ranks quadratic)."""
    features = torch.randn(count, 9, 9, 4, requires_grad=True)
    shift = torch.randint(-1, 2, (count, 2), generator=torch.Generator().manual_seed(0))
    moved, seen = to_crop_frame(features, shift)
    with _Allocated() as allocated:
        moved.sum().backward()
    assert allocated.elements < 8 * features.numel()
    expected = torch.zeros_like(features)
    for b, (r, c) in enumerate(shift.tolist()):
        expected[b, max(-r, 0) : 9 - max(r, 0), max(-c, 0) : 9 - max(c, 0)] = 1  # seen, moved
    assert torch.equal(features.grad, expected)
    assert int(seen.sum()) == int(expected[..., 0].sum())


def test_masked_loss_averages_over_the_overlap_only():
    generator = torch.Generator().manual_seed(2)
    pred = torch.randn(2, 3, 3, 4, generator=generator, requires_grad=True)
    target = torch.randn(2, 3, 3, 4, generator=generator)
    valid = torch.ones(2, 3, 3, dtype=torch.bool)
    for loss in (MSE(), Cosine()):  # an all-valid mask is the plain loss, bit for bit
        assert torch.equal(masked_loss(loss, pred, target, valid, False), loss(pred, target))
        assert torch.equal(masked_loss(loss, pred, target, valid, True), loss(pred, target, True))
    valid[0, 0] = False
    valid[1, :, 2] = False
    value = masked_loss(MSE(), pred, target, valid, False)
    manual = (pred - target)[valid].square().mean()
    torch.testing.assert_close(value, manual)
    per_image = masked_loss(MSE(), pred, target, valid, True)
    torch.testing.assert_close(per_image[0], (pred - target)[0][valid[0]].square().mean())
    value.backward()
    assert (pred.grad[~valid] == 0).all() and (pred.grad[valid] != 0).all()


def test_shift_distributions():
    torch.manual_seed(3)
    draws = PatchShifts().draw(20000)
    share_zero = (draws == 0).float().mean().item()  # P(|N(0, 0.5)| < 0.5) = 0.683 per axis
    assert share_zero == pytest.approx(0.683, abs=0.015)
    assert draws.abs().max() <= 2
    state = torch.get_rng_state()
    assert PatchShifts(std=0.0).draw(5).abs().sum() == 0
    assert torch.equal(state, torch.get_rng_state())  # std 0 draws nothing
    uniform = PatchShifts("uniform", max_shift=3).draw(5000)
    assert set(uniform.flatten().tolist()) == set(range(-3, 4))
    with pytest.raises(ValueError, match="model.shifts.init_args.distribution"):
        PatchShifts("laplace")
    with pytest.raises(ValueError, match="model.shifts.init_args.margin"):
        PatchShifts(margin=-0.1)


def test_a_shift_that_leaves_the_margin_is_rejected_on_that_axis():
    """FeatSharp's rule (notes 2.3): a jitter leaving the image is dropped, per axis. A 0.125
    margin holds one 16 px patch at 128 px: the recipe's |k| = 2 (0.3% per axis) becomes 0
    there, and stays at 256 px; a view whose margin holds no patch is never shifted, said
    once."""
    shifts = PatchShifts("uniform", max_shift=2)
    drawn = torch.tensor([[2, -1], [-2, 2], [1, 0]])
    kept = shifts.within_margin(drawn, ((128, 128), 16), "the student")
    assert kept.tolist() == [[0, -1], [0, 0], [1, 0]]
    assert torch.equal(shifts.within_margin(drawn, ((256, 256), 16), "the student"), drawn)
    with pytest.warns(UserWarning, match="teacher sam's 48x48 px view .* never shifted"):
        assert not shifts.within_margin(drawn, ((48, 48), 16), "teacher sam").any()
    torch.manual_seed(0)
    chunk = shifts.chunk_shifts(4, ((256, 256), 16), {"clip": ((128, 128), 16)})
    assert chunk.margin == 0.125 and chunk.student.device.type == "cpu"
    assert chunk.teachers["clip"].abs().max() <= 1 and chunk.student.abs().max() <= 2


def _fit(tmp_path, **overrides) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    module = tiny_module(**overrides)
    cpu_trainer(tmp_path, max_steps=2).fit(module, image_batches())
    return {k: v.clone() for k, v in module.state_dict().items()}


def test_zero_shift_is_todays_training_bit_for_bit(tmp_path):
    """Two steps (CLIP, DINOv2 and a SAM canvas teacher) with shifts of 0 and no margin end
    with the weights of the unshifted run, exactly; real shifts change them."""
    plain = _fit(tmp_path / "plain")
    zero = _fit(tmp_path / "zero", shifts=PatchShifts(std=0.0, margin=0.0))
    assert plain.keys() == zero.keys()
    assert all(torch.equal(plain[k], zero[k]) for k in plain)
    shifted = _fit(tmp_path / "shifted", shifts=PatchShifts("uniform", max_shift=1, margin=0.25))
    assert all(torch.isfinite(v).all() for v in shifted.values() if v.is_floating_point())
    assert not torch.equal(
        plain["student.patch_embed.proj.weight"],
        shifted["student.patch_embed.proj.weight"],
    )


@pytest.mark.parametrize("policy", ["student", "larger"])
def test_shifts_work_with_every_grid_policy(tmp_path, policy):
    """Teacher maps resampled to the loss grid carry their overlap mask along: a zero shift
    is still the unshifted run, and real shifts train."""
    plain = _fit(tmp_path / "plain", grid_policy=policy)
    zero = _fit(tmp_path / "zero", grid_policy=policy, shifts=PatchShifts(std=0.0, margin=0.0))
    assert all(torch.equal(plain[k], zero[k]) for k in plain)
    shifted = _fit(
        tmp_path / "shifted", grid_policy=policy, shifts=PatchShifts("uniform", margin=0.5)
    )
    assert all(torch.isfinite(v).all() for v in shifted.values() if v.is_floating_point())


def test_a_cache_written_for_another_margin_is_refused():
    """Cached teacher outputs are of the crop's shared region: a run viewing another region
    (another model.shifts margin) is refused in one line."""
    from radio_lit.cache.manifest import Manifest, check_run

    manifest = Manifest({}, {"view_margin": 0.125}, views=1, dtype="float32", samples_per_shard=1)
    with pytest.raises(ValueError, match="less a 0.125 margin, this run views it less a 0.25"):
        check_run(manifest, "cache", {}, None, 16, margin=0.25)  # type: ignore[arg-type]
