"""One gloo rank of ``test_two_ranks_draw_their_own_damp_noise_and_shifts`` (tests/module).

Both ranks build the same tiny module (same seed), start the student step's streams for their
global rank, draw one training step's view shifts and run the student on the same crops with
DAMP's noise; then gather every rank's stream state as a checkpoint does, restore their own
into a fresh step and draw the next step again. Saves what each drew.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from radio_lit.geometry.shifts import PatchShifts
from radio_lit.students.damp import DAMP
from radio_lit.training.student_step import StudentStep
from radio_lit.training.views import shifted_chunks
from tests.builders import tiny_module


def _draw(module, crop: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    (chunk,) = module.partitions.chunks(crop, train=True)
    step = module.student_step
    (chunk,) = shifted_chunks([chunk], step.shifts, step.streams["shifts"], module.teachers, 16)
    features = module.run_student(chunk.crop, chunk.resolution, chunk.shifts.student).features
    shifts = torch.cat([chunk.shifts.student, *chunk.shifts.teachers.values()])
    return shifts, features.detach()


def main(rank: int, world_size: int, init_file: str, output: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    torch.manual_seed(0)  # the same module (and global generators) on every rank
    shifts = PatchShifts("uniform", max_shift=1, margin=0.25)
    module = tiny_module(damp=DAMP(std=0.3), shifts=shifts).train()
    crop = torch.rand(4, 3, 96, 96, generator=torch.Generator().manual_seed(1))
    module.student_step.begin(module.student, 0, rank)
    global_state = torch.get_rng_state()
    first = _draw(module, crop)
    untouched = torch.equal(global_state, torch.get_rng_state())
    ranks = module.student_step.state_dict()  # every rank's, as on_save_checkpoint
    second = _draw(module, crop)
    step = module.student_step  # a fresh step object, as a resumed run builds
    module.student_step = StudentStep(
        step.patch, step.resolution, step.conditioner, shifts, step.damp
    )
    module.student_step.load_state_dict(ranks, world_size, rank)
    module.student_step.begin(module.student, 1, rank)
    again = _draw(module, crop)
    torch.save(
        {"first": first, "second": second, "again": again, "ranks": ranks, "global": untouched},
        output,
    )
    dist.destroy_process_group()
