"""One gloo rank of tests/students/test_fsdp2_ema.py: the EMA update under FSDP2 with a bf16
``MixedPrecisionPolicy``, at world size 1 (FSDP2's own path: no all-gather) or 2.

The tiny student and its heads and their EMA copy are sharded as ``configure_model`` does
(:func:`radio_lit.students.sharding.shard_module`, bf16 gathered weights). One step: the EMA's
forward under ``no_grad`` (MESA's), the student's forward and backward, an SGD update, then a
forward of the live student under ``no_grad`` (the guard's diagnosis, an evaluation): both
FSDP2 roots keep their gathered parameters, plain tensors, after those forwards. The rank then
records what the update before this fix did (the EMA resharded, the live side not: one list of
``DTensor`` s, one of plain tensors) and what :meth:`EMAStudent.update` does now.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from radio_lit.students.ema import EMAStudent, _reshard, check_pairs
from radio_lit.students.heads import teacher_heads
from radio_lit.students.sharding import shard_module
from tests.builders import tiny_student


def _full(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``module``'s full parameters (resharded first, then gathered: a collective)."""
    _reshard(module)
    return {n: p.full_tensor().detach().clone() for n, p in module.named_parameters()}


def main(rank: int, world_size: int, init_file: str, output: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size
    )
    torch.manual_seed(0)
    student, heads = tiny_student(), teacher_heads(32, {"t": (24, 16)})
    ema = EMAStudent(student, heads, decay=0.5)
    mesh = init_device_mesh("cpu", (world_size,))
    shard_module(student, heads, torch.nn.Module(), ema, mesh, "bf16-mixed")
    optimizer = torch.optim.SGD([*student.parameters(), *heads.parameters()], lr=0.1)
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        ema.student(images)  # MESA's forward: no backward follows
    out = student(images)
    heads["t"].features(out.features).float().square().mean().backward()
    optimizer.step()
    live, before = _full(student), _full(ema.student)
    with torch.no_grad():
        student.eval()(images)  # a no-grad forward of the live root before the update
    student.train()
    kinds = {type(p).__name__ for p in student.parameters()}
    old_error = ""
    try:  # the update before the fix: only the EMA resharded
        _reshard(ema)
        pairs = [*ema.student.parameters(), *ema.heads.parameters()]
        lives = [p.detach() for p in [*student.parameters(), *heads.parameters()]]
        torch._foreach_lerp_(pairs, lives, 0.5)
    except RuntimeError as error:
        old_error = str(error).split("\n")[0]
    ema.update(student, heads)
    after = _full(ema.student)
    mismatch = ""
    try:  # one clear error for a live side sharded unlike the EMA
        check_pairs(list(ema.student.named_parameters()), list(tiny_student().parameters()))
    except RuntimeError as error:
        mismatch = str(error)
    expected = {n: 0.5 * before[n] + 0.5 * live[n] for n in before}
    torch.save(
        {
            "live_kinds": sorted(kinds),
            "old_error": old_error,
            "close": all(torch.allclose(after[n], expected[n]) for n in after),
            "mismatch": mismatch,
            "compute_dtype": str(out.features.dtype),
        },
        output,
    )
    dist.destroy_process_group()
