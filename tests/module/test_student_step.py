"""StudentStep's contract with DistillationModule (radio_lit/student_step.py): the views it
shifts, the MESA term it adds, and the per-step draws it asks of the student."""

from __future__ import annotations

import torch

from radio_lit.partitions import Chunk
from radio_lit.shifts import PatchShifts
from radio_lit.student_step import StudentStep
from radio_lit.students import CPEViT
from radio_lit.students.ema import MESA
from tests.builders import cpu_trainer, image_batches, tiny_module, tiny_student

MEAN = STD = (0.5, 0.5, 0.5)


def _chunk() -> Chunk:
    return Chunk("all", torch.rand(3, 3, 64, 64), ("clip", "sam"), (64, 64), 1.0)


def test_views_shift_the_student_and_only_live_teachers():
    step = StudentStep((64, 64), MEAN, STD, PatchShifts(distribution="uniform", max_shift=2))
    torch.manual_seed(0)
    (live,) = step.views([_chunk()], live=True)
    torch.manual_seed(0)
    (cached,) = step.views([_chunk()], live=False)
    assert live.shifts is not None and cached.shifts is not None
    assert live.shifts.teachers.keys() == {"clip", "sam"} and cached.shifts.teachers == {}
    assert torch.equal(live.shifts.student, cached.shifts.student)  # drawn first, alike
    assert live.shifts.student.shape == (3, 2) and live.shifts.student.abs().max() <= 2
    unshifted = StudentStep((64, 64), MEAN, STD)
    chunk = _chunk()
    assert unshifted.views([chunk], live=True) == [chunk]


def test_mesa_adds_nothing_without_the_ema_or_with_weight_zero():
    loss = torch.tensor(2.0)
    chunk, out = _chunk(), tiny_student()(torch.rand(3, 3, 64, 64))
    kept_only = tiny_module(mesa=MESA(weight=0.0))
    for module in (tiny_module(), kept_only):
        step = module.student_step
        assert step.add_mesa(loss, [chunk], [out], module.heads, module.ema) == (loss, {})
    assert kept_only.ema is not None  # weight 0 keeps the EMA


def test_vitdet_is_drawn_once_per_optimizer_step_from_the_runs_seed(tmp_path, monkeypatch):
    """Every micro-batch of one update runs alike; the seed is the one Lightning gives every
    rank (``PL_GLOBAL_SEED``), the step the optimizer step (restored on resume)."""
    calls: list[tuple[int, int]] = []
    draw = CPEViT.begin_step

    def recording(self: CPEViT, seed: int, step: int) -> None:
        calls.append((seed, step))
        draw(self, seed, step)

    monkeypatch.setattr(CPEViT, "begin_step", recording)
    monkeypatch.setenv("PL_GLOBAL_SEED", "3")
    student = tiny_student(vitdet_window_sizes=[2], vitdet_probability=0.5)
    trainer = cpu_trainer(tmp_path, max_steps=2, accumulate_grad_batches=2)
    trainer.fit(tiny_module(student=student), image_batches(num_images=16))
    assert calls == [(3, 0), (3, 0), (3, 1), (3, 1)]
