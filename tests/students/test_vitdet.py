"""ViTDet window augmentation (AM-RADIO supplement C; NVlabs/RADIO radio/vitdet.py)."""

import numpy as np
import pytest
import torch
from torch import nn

from radio_lit.students.vitdet import (
    default_num_windowed,
    run_windowed,
    windowed_blocks,
    windowed_step,
)
from tests.builders import tiny_student


class Recording(nn.Module):
    """An identity block that records the shape of every input it gets."""

    def __init__(self) -> None:
        super().__init__()
        self.shapes: list[tuple[int, ...]] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.shapes.append(tuple(x.shape))
        return x


def test_windows_follow_sams_vitdet_layout_and_the_last_block_is_global():
    def global_blocks(depth: int) -> list[int]:
        flags = windowed_blocks(depth, default_num_windowed(depth))
        return [i for i, local in enumerate(flags) if not local]

    # SAM's image encoders (segment_anything build_sam: global_attn_indexes).
    assert global_blocks(12) == [2, 5, 8, 11]
    assert global_blocks(24) == [5, 11, 17, 23]
    assert global_blocks(32) == [7, 15, 23, 31]
    # Supplement C: num_windowed windowed blocks, then a global one; the last is always global.
    assert windowed_blocks(5, 3) == [True, True, True, False, False]
    assert windowed_blocks(2, 5) == [True, False]
    with pytest.raises(ValueError, match="vitdet_num_windowed"):
        windowed_blocks(4, 0)


def test_token_order_is_restored_exactly_and_prefix_tokens_skip_windowed_blocks():
    blocks = [Recording() for _ in range(4)]
    tokens = torch.randn(2, 3 + 8 * 12, 5)  # 3 prefix tokens, an 8 x 12 patch grid
    out = run_windowed(blocks, tokens, 3, (8, 12), 4, [True, True, False, False])
    assert torch.equal(out, tokens)
    # Windowed blocks see the 6 windows of 16 patches of each image, global ones everything.
    assert blocks[0].shapes == blocks[1].shapes == [(2 * 6, 16, 5)]
    assert blocks[2].shapes == blocks[3].shapes == [(2, 3 + 96, 5)]


def test_each_window_holds_one_contiguous_square_of_the_grid():
    grid = torch.arange(4 * 6, dtype=torch.float32).reshape(1, 24, 1)  # token value = position
    seen = []

    def block(x: torch.Tensor) -> torch.Tensor:
        seen.append(x.clone())
        return x

    run_windowed([block, block], grid, 0, (4, 6), 2, [True, False])
    windows = seen[0][..., 0]  # [6 windows, 4 tokens]
    assert windows[0].tolist() == [0, 1, 6, 7]  # top-left 2 x 2 window, row-major
    assert windows[1].tolist() == [2, 3, 8, 9]
    assert windows[3].tolist() == [12, 13, 18, 19]  # second row of windows


def _per_window_reference(student, tokens, num_prefix, grid, window):
    """Block 0 run separately on each window cut out of the 2-D grid, prefix untouched;
    block 1 global on everything (windowed_blocks(2, .) == [True, False])."""
    batch, _, dim = tokens.shape
    h, w = grid
    prefix, patches = tokens[:, :num_prefix], tokens[:, num_prefix:].reshape(batch, h, w, dim)
    out = torch.empty_like(patches)
    for y in range(0, h, window):
        for x in range(0, w, window):
            cell = patches[:, y : y + window, x : x + window].reshape(batch, -1, dim)
            out[:, y : y + window, x : x + window] = student.blocks[0](cell).reshape(
                batch, window, window, dim
            )
    joined = torch.cat([prefix, out.reshape(batch, h * w, dim)], dim=1)
    return student.blocks[1](joined)


@torch.no_grad()
def test_a_windowed_forward_equals_per_window_attention():
    torch.manual_seed(0)
    student = tiny_student(num_cls_tokens=2, num_registers=1, vitdet_eval_window_size=4).eval()
    assert student.windowed == [True, False]
    tokens = torch.randn(2, 3 + 8 * 12, 32)
    windowed = student.run_blocks(tokens, 3, (8, 12))
    reference = _per_window_reference(student, tokens, 3, (8, 12), 4)
    torch.testing.assert_close(windowed, reference, rtol=1e-5, atol=1e-5)
    # ... and differs from global attention, which the same student runs without the option.
    student.vitdet_eval_window_size = None
    assert not torch.allclose(student.run_blocks(tokens, 3, (8, 12)), reference, atol=1e-3)


def test_training_samples_a_tiling_window_size_per_forward_from_the_global_rng():
    student = tiny_student(vitdet_window_sizes=[2, 3, 4]).train()
    torch.manual_seed(0)
    drawn = [student.vitdet_window((8, 8)) for _ in range(40)]
    assert set(drawn) == {2, 4}  # 3 does not tile an 8 x 8 grid
    torch.manual_seed(0)
    assert [student.vitdet_window((8, 8)) for _ in range(40)] == drawn
    assert student.eval().vitdet_window((8, 8)) is None  # no eval-time window configured
    # The whole student trains with windows: finite outputs, gradients reach every block.
    student.train()
    out = student(torch.randn(2, 3, 128, 128))
    out.features.sum().backward()
    assert all(p.grad is not None for p in student.blocks.parameters())


def test_a_grid_no_window_size_tiles_runs_global_attention_with_a_warning():
    student = tiny_student(vitdet_window_sizes=[4]).train()
    with pytest.warns(UserWarning, match=r"tile no 3x5 patch grid"):
        assert student.vitdet_window((3, 5)) is None
    with pytest.raises(ValueError, match="vitdet_window_sizes"):
        tiny_student(vitdet_window_sizes=[0])


def test_a_step_runs_windowed_with_probability_p_drawn_from_the_seed_and_step_alone():
    """The same draw on every rank and after a resume: it reads no generator's state (ranks'
    global RNGs differ with partitions) and leaves them untouched (the step's other draws)."""
    draws = [windowed_step(0.3, 0, step) for step in range(4000)]
    assert sum(draws) / len(draws) == pytest.approx(0.3, abs=0.03)
    torch.manual_seed(1)
    np.random.seed(1)
    torch_state, numpy_state = torch.get_rng_state(), np.random.get_state()[1].copy()
    assert [windowed_step(0.3, 0, step) for step in range(4000)] == draws
    assert torch.equal(torch.get_rng_state(), torch_state)
    assert np.array_equal(np.random.get_state()[1], numpy_state)
    assert [windowed_step(0.3, 1, step) for step in range(4000)] != draws  # another seed
    assert all(windowed_step(1.0, 0, step) for step in range(50))
    assert not any(windowed_step(0.0, 0, step) for step in range(50))


def test_a_step_drawn_global_trains_with_global_attention_and_eval_ignores_the_draw():
    student = tiny_student(vitdet_window_sizes=[2], vitdet_probability=0.5).train()
    plain = tiny_student(vitdet_window_sizes=None).train()
    plain.load_state_dict(student.state_dict())
    steps = {windowed_step(0.5, 0, step): step for step in range(10)}  # one step of each kind
    images = torch.randn(2, 3, 64, 64)
    outputs = {}
    for windowed, step in steps.items():
        student.begin_step(0, step)
        assert student.vitdet_window((4, 4)) == (2 if windowed else None)
        torch.manual_seed(0)  # the same CPE windows for both students
        outputs[windowed] = student(images).features
    torch.manual_seed(0)
    assert torch.equal(outputs[False], plain(images).features)
    assert not torch.allclose(outputs[True], outputs[False], atol=1e-4)
    student.eval()
    for step in steps.values():
        student.begin_step(0, step)
        assert student.vitdet_window((4, 4)) is None  # no eval-time window configured
    with pytest.raises(ValueError, match=r"vitdet_probability must lie in \[0, 1\]"):
        tiny_student(vitdet_window_sizes=[2], vitdet_probability=1.5)
    with pytest.raises(ValueError, match="vitdet_probability 0.5 needs vitdet_window_sizes"):
        tiny_student(vitdet_probability=0.5)
