"""``radio-lit plan`` of a packed step (``model.student_packing``, radio_lit.students.packing):
the fake step runs the packed forward with the kernel a GPU would choose and counts the
attention that kernel computes, against the closed forms of NaViT's packing (Dehghani et al.
2023): per image ``4 D n_i^2`` FLOPs a block for the fused kernels, ``4 D L^2`` for each image
padded to the longest ``L``; the token-wise GEMMs over the sum of the tokens either way."""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from radio_lit.planning.counting import count_step, fake_module
from radio_lit.students.packing import StudentPacking
from radio_lit.training.partitions import Partition
from tests.builders import tiny_module

#: Two partitions on every rank: 4 images at 32 px and 2 at 64 px, patch 16.
PARTS = {
    "low": Partition(batch_size=4, resolutions=[32], every_rank=True),
    "high": Partition(batch_size=2, resolutions=[64], every_rank=True),
}


def _forward_attention(kernel: str | None) -> tuple[str | None, dict[int, int], int, object]:
    """The packed count's kernel, its forward attention FLOPs by sequence length, and the
    student's ``(width, depth, prefix tokens)``."""
    module = tiny_module(partitions=PARTS, student_packing=StudentPacking(kernel=kernel))
    student = module.student
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_module(module, mode)
    count = count_step(module, mode, 64, 6, torch.bfloat16, device="cpu")
    flops: dict[int, int] = {}
    for (part, _, query, _, _, _, backward), f in count.ops.attention.items():
        if part == "student forward" and not backward:
            flops[query] = flops.get(query, 0) + f
    prefix = student.num_cls_tokens + student.num_registers
    shape = (student.embed_dim, len(student.blocks), prefix)
    return count.packed_kernel, flops, count.total_images, shape


def test_a_fused_kernel_is_counted_as_each_images_own_attention():
    chosen, flops, images, (width, depth, prefix) = _forward_attention("varlen")
    assert chosen == "varlen" and images == 6
    low, high = prefix + 2 * 2, prefix + 4 * 4
    assert flops == {low: 4 * width * 4 * low**2 * depth, high: 4 * width * 2 * high**2 * depth}


def test_without_a_measurement_a_gpu_runs_and_the_plan_counts_padding():
    chosen, flops, _, (width, depth, prefix) = _forward_attention(None)
    longest = prefix + 4 * 4
    assert chosen == "padded"  # never a fused kernel by default without a measured table
    assert flops == {longest: 4 * width * 6 * longest**2 * depth}
