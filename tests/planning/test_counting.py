"""The step counter's memory rules (:mod:`radio_lit.planning.counting`) on small real tensors:
what a view allocates, FSDP2's gathered bfloat16 weights, the bytes an operation moves."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radio_lit.planning.counting import (
    StepCounter,
    fsdp2_copies,
    gathered_weights,
    touched_bytes,
)


def test_a_view_of_a_weight_is_not_a_second_weight():
    weight, x = torch.randn(512, 256), torch.randn(4, 256)  # made before the count: not counted
    with torch.no_grad(), StepCounter() as counter:  # F.linear dispatches t(weight), a view
        out = F.linear(x, weight)
        transposed = weight.t()
    assert transposed.untyped_storage().data_ptr() == weight.untyped_storage().data_ptr()
    assert counter.peak == out.untyped_storage().nbytes()


def test_gathered_weights_are_counted_in_bf16_and_restored():
    layer = nn.Linear(256, 512)
    master = layer.weight.data
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    with StepCounter() as counter, gathered_weights([layer], torch.bfloat16):
        assert layer.weight.dtype == torch.bfloat16
        layer(x).float().sum().backward()
        assert layer.weight.grad.dtype == torch.bfloat16  # FSDP2's unsharded gradient
        peak = counter.peak
    gathered = (512 * 256 + 512) * 2
    assert peak >= gathered + gathered  # the gathered copy, then its gradients as produced
    assert layer.weight.dtype == torch.float32
    assert layer.weight.data_ptr() == master.data_ptr()  # the master weights themselves
    assert layer.weight.grad is None


def test_the_gathered_copy_is_freed_before_the_reduce_scatter_and_the_gradients_kept():
    """FSDP2's post-backward reshard frees the unsharded weights before its reduce-scatter's
    buffers are made: after ``reshard`` only the gradients of the copy are counted."""
    layer = nn.Linear(256, 512)
    x = torch.randn(4, 256, dtype=torch.bfloat16)
    with StepCounter() as counter, gathered_weights([layer], torch.bfloat16) as reshard:
        layer(x).float().sum().backward()
        before = counter.current
        reshard()
        assert layer.weight.dtype == torch.float32
        assert layer.weight.grad.dtype == torch.bfloat16  # the unsharded gradient, kept
        after = counter.current
    assert before - after == (512 * 256 + 512) * 2  # the gathered bf16 copy
    assert layer.weight.grad is None


def test_fsdp2_gathers_a_copy_even_in_the_master_dtype():
    """FSDP2 all-gathers into a buffer of its own on any number of ranks: a float32 run's
    gathered weights are a second float32 copy, counted in the step."""
    layer = nn.Linear(256, 512)
    master = layer.weight.data
    with StepCounter() as counter, gathered_weights([layer], torch.float32):
        assert layer.weight.data_ptr() != master.data_ptr()
        peak = counter.peak
    assert peak == (512 * 256 + 512) * 4
    assert layer.weight.data_ptr() == master.data_ptr()


def test_bytes_moved_are_the_memory_a_tensor_spans():
    row = torch.randn(1, 256)
    assert touched_bytes(row) == 256 * 4
    assert touched_bytes(row.expand(64, 256)) == 256 * 4  # broadcast: one row in memory
    assert touched_bytes(torch.randn(64, 256)[:, :8]) == 64 * 8 * 4  # a slice: its elements
    counter = StepCounter()
    with counter:
        torch.empty(1024)  # an allocation reads and writes nothing
        row.expand(64, 256) * 2.0  # reads one row, writes 64
    assert counter.ops.moved["other"] == (256 + 64 * 256) * 4
    # FSDP2's own copies (torch's _fully_shard), read and written; two ranks: the shard's
    # copy-in, the gathered copy-out, the gradients' copy-in, the division
    assert fsdp2_copies(800, 400, 2) == 2 * 400 + 2 * 800 + 2 * 800 + 2 * 400
    # one rank: the shard copied into the parameters, the gradients' copy-in and their copy out
    assert fsdp2_copies(800, 800, 1) == 2 * 800 + 2 * 800 + 2 * 800
    assert fsdp2_copies(0, 0, 4) == 0
