"""StudentStep's contract with DistillationModule (radio_lit/training/student_step.py and the
views it shifts, radio_lit/training/views.py): the MESA term's EMA views, the per-step draws it
asks of the student, and each rank's own random streams (DAMP's noise, shifts, CPE windows), in
checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader

from radio_lit.cache import CachedBatch
from radio_lit.callbacks import RandomStates
from radio_lit.geometry.shifts import PatchShifts
from radio_lit.students import CPEViT
from radio_lit.students.conditioner import StudentConditioner
from radio_lit.students.damp import DAMP
from radio_lit.students.ema import MESA
from radio_lit.training.partitions import Chunk
from radio_lit.training.student_step import StudentStep
from radio_lit.training.views import shifted_chunks, step_views
from tests.builders import cpu_trainer, image_batches, tiny_module, tiny_student
from tests.distributed.gloo import run_gloo_workers

MEAN = STD = (0.5, 0.5, 0.5)


def _chunk() -> Chunk:
    return Chunk("all", torch.rand(3, 3, 64, 64), ("clip", "sam"), (64, 64), 1.0)


def test_views_shift_the_student_and_only_live_teachers():
    module = tiny_module(shifts=PatchShifts(distribution="uniform", max_shift=2, margin=0.5))
    step, teachers = module.student_step, module.teachers
    torch.manual_seed(0)
    stream = step.streams["shifts"]
    (live,) = shifted_chunks([_chunk()], step.shifts, stream, teachers, step.patch)  # live teachers
    torch.manual_seed(0)
    (cached,) = shifted_chunks([_chunk()], step.shifts, stream, teachers, step.patch, live=False)
    assert live.shifts is not None and cached.shifts is not None
    assert live.shifts.teachers.keys() == {"clip", "sam"} and cached.shifts.teachers == {}
    assert torch.equal(live.shifts.student, cached.shifts.student)  # drawn first, alike
    assert live.shifts.student.shape == (3, 2) and live.shifts.student.abs().max() <= 2
    assert live.shifts.student.device.type == "cpu" and live.shifts.margin == 0.5
    unshifted = StudentStep(16, (64, 64), StudentConditioner(MEAN, STD))
    crop = torch.randint(0, 255, (3, 3, 64, 64), dtype=torch.uint8)
    (chunk,) = step_views(crop, module.partitions, unshifted, teachers, train=True)
    assert chunk.shifts is None and torch.equal(chunk.crop, crop.float() / 255)
    (cached_chunk,) = step_views(CachedBatch(crop, {}), module.partitions, step, teachers, False)
    assert cached_chunk.shifts is None  # evaluation: unshifted


def test_each_rank_draws_from_its_own_streams_and_the_global_generators_stay():
    """Seeded from the run's seed and the global rank: ranks 0 and 1 draw different shifts and
    DAMP noise, the same rank the same; torch's global generators are left as they were."""

    def draws(rank: int) -> tuple[torch.Tensor, torch.Tensor]:
        torch.manual_seed(0)
        shifts = PatchShifts("uniform", max_shift=1, margin=0.25)
        module = tiny_module(damp=DAMP(std=0.3), shifts=shifts).train()
        crop = torch.rand(4, 3, 96, 96, generator=torch.Generator().manual_seed(1))
        module.student_step.begin(module.student, 0, rank)
        state = torch.get_rng_state()
        chunks = module.partitions.chunks(crop, True)
        step = module.student_step
        (chunk,) = shifted_chunks(chunks, step.shifts, step.streams["shifts"], module.teachers, 16)
        out = module.run_student(chunk.crop, chunk.resolution, chunk.shifts.student).features
        assert torch.equal(state, torch.get_rng_state())
        return chunk.shifts.student, out.detach()

    (shift0, out0), (shift1, out1), (again, out_again) = draws(0), draws(1), draws(0)
    assert not torch.equal(shift0, shift1) and not torch.equal(out0, out1)
    assert torch.equal(shift0, again) and torch.equal(out0, out_again)


@pytest.mark.distributed
def test_two_ranks_draw_their_own_damp_noise_and_shifts(tmp_path: Path):
    """Two gloo ranks, the same module, seed and crops: each draws its own shifts and DAMP
    noise (the DAMP paper's fresh draw per device); a checkpoint holds both ranks' streams,
    and each rank restored from it draws exactly what it drew next without the restart."""
    worker = Path(__file__).parents[1] / "students" / "rank_streams_worker.py"
    rank0, rank1 = run_gloo_workers(worker, tmp_path)
    for name in ("first", "second"):  # shifts, then the student's DAMP-noised features
        assert not torch.equal(rank0[name][0], rank1[name][0])
        assert not torch.equal(rank0[name][1], rank1[name][1])
    saved = [_states(result["ranks"]) for result in (rank0, rank1)]
    assert len(saved[0]) == 2 * 2 and not torch.equal(saved[0][0], saved[0][2])  # per rank
    assert all(torch.equal(a, b) for a, b in zip(*saved, strict=True))  # gathered alike
    for result in (rank0, rank1):
        assert result["global"]  # the global generators are not drawn from
        assert torch.equal(result["again"][0], result["second"][0])
        assert torch.equal(result["again"][1], result["second"][1])


def _states(ranks: list[dict]) -> list[torch.Tensor]:
    """Every rank's forward and shift stream states (CPU generators) of a checkpoint entry."""
    return [rank[name]["states"]["cpu"] for rank in ranks for name in ("forward", "shifts")]


class _StreamRecorder(Callback):
    """After each training step: the student step's stream states (what it has drawn: DAMP's
    noise and the CPE windows of its forward stream, the shifts of its shift stream) and the
    student's weights."""

    def __init__(self) -> None:
        self.states: list[list[torch.Tensor]] = []
        self.weights: list[dict[str, torch.Tensor]] = []

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx) -> None:
        self.states.append([t.clone() for t in _states(module.student_step.state_dict())])
        self.weights.append({k: v.clone() for k, v in module.student.state_dict().items()})


class _StopAfterFirstEpoch(Callback):
    """Save a checkpoint at the end of the first epoch and stop there (an interrupted run with
    the uninterrupted run's schedule)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def on_train_epoch_end(self, trainer, module) -> None:
        trainer.save_checkpoint(self.path)
        trainer.should_stop = True


def _fit(tmp_path: Path, resume: str | None = None, stop: Path | None = None):
    """4 steps (2 epochs of 2 batches) of a module with DAMP, shifts and MESA."""
    torch.manual_seed(0)
    shifts = PatchShifts("uniform", max_shift=1, margin=0.25)
    module = tiny_module(damp=DAMP(std=0.3), shifts=shifts, mesa=MESA(decay=0.5))
    recorder = _StreamRecorder()
    callbacks = [RandomStates(), recorder] + ([_StopAfterFirstEpoch(stop)] if stop else [])
    loader = image_batches()  # with a generator of its own, as the datamodules' loaders
    loader = DataLoader(loader.dataset, batch_size=4, generator=torch.Generator().manual_seed(0))
    cpu_trainer(tmp_path, max_steps=4, callbacks=callbacks).fit(module, loader, ckpt_path=resume)
    return module, recorder


def test_a_resumed_run_draws_the_noise_and_shifts_of_the_uninterrupted_one(tmp_path: Path):
    """Through Lightning: 2 steps, a checkpoint, 2 more from it: every step's stream states
    (DAMP noise, CPE windows, shifts) are the uninterrupted run's, and so is the student after
    the first resumed step, bit for bit; a checkpoint without the streams (written before
    them) resumes with fresh ones, which draw differently. (The whole run is bit for bit in
    tests/cli/test_c_radio_resume.py, a real ``radio-lit fit`` killed and resumed.)"""
    _, whole = _fit(tmp_path / "whole")
    checkpoint = tmp_path / "interrupted.ckpt"
    _fit(tmp_path / "first", stop=checkpoint)
    _, resumed = _fit(tmp_path / "resumed", str(checkpoint))
    steps = zip(whole.states[2:], resumed.states, strict=True)
    assert all(all(map(torch.equal, whole_step, step)) for whole_step, step in steps)
    assert all(torch.equal(whole.weights[2][k], v) for k, v in resumed.weights[0].items())
    old = torch.load(checkpoint, weights_only=True)
    del old["random_streams"]
    torch.save(old, tmp_path / "old.ckpt")
    _, fresh = _fit(tmp_path / "fresh", str(tmp_path / "old.ckpt"))
    assert not any(map(torch.equal, whole.states[2], fresh.states[0]))
    key = "patch_embed.proj.weight"
    assert not torch.equal(whole.weights[2][key], fresh.weights[0][key])


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


def test_shifted_views_damp_and_mesa_read_no_device_value(tmp_path: Path):
    """The GPU profile found 4 device reads per step in the shifts (``bool(tokens.any())``):
    shifts are drawn and kept on the host now, so a step with shifts, DAMP and MESA reads one
    device value, the guard's verdict (benchmarks/dispatch.py's ScalarReads follows on a CPU
    which tensors a GPU would hold)."""
    from radio_lit.callbacks import NonFiniteGuard
    from tests.callbacks.test_host_syncs import DeviceReadsPerStep

    torch.manual_seed(0)
    shifts = PatchShifts("uniform", max_shift=1, margin=0.25)
    module = tiny_module(shifts=shifts, damp=DAMP(std=0.1), mesa=MESA(decay=0.5))
    probe = DeviceReadsPerStep()
    callbacks = [NonFiniteGuard(), probe]
    trainer = cpu_trainer(tmp_path, max_steps=3, log_every_n_steps=50, callbacks=callbacks)
    trainer.fit(module, image_batches(12, 4))
    assert probe.logged[1] is False
    assert sum(probe.steps[1].values()) == 1, probe.steps[1]
    assert all("radio_lit/callbacks/guard.py" in where for where in probe.steps[1])
