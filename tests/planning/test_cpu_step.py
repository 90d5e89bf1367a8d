"""``radio-lit plan``'s counts against a real CPU step: the step that
``benchmarks/train_step.py --device cpu`` builds (the quickstart, one float32 process, its
overrides), run once on real tensors and once on fake ones by the same code.

- FLOPs: the fake step's count equals ``torch.utils.flop_counter.FlopCounterMode``'s count of
  the real step;
- memory: the fake step's peak of live bytes is within 15 % of the peak the CPU allocator
  reported to ``torch.profiler`` (``profile_memory``) during the real step.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import sys
from unittest import mock

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode

from benchmarks import harness
from benchmarks.train_step import device_overrides
from radio_lit.planning.counting import count_step, fake_module


def _profiled_peak(prof: profile) -> int:
    """The most bytes the CPU allocator held beyond what it held when profiling began (its
    allocation events' running total, as it reported them)."""

    def nodes(tree):
        for node in tree:
            yield node
            yield from nodes(node.children)

    tree = prof.profiler.kineto_results.experimental_event_tree()
    totals = [
        n.extra_fields.total_allocated
        for n in nodes(tree)
        if hasattr(n.extra_fields, "total_allocated")
    ]
    return max(totals)


@pytest.fixture(scope="module")
def quickstart():
    config = harness.load_config(harness.QUICKSTART)
    overrides, _ = device_overrides(config, argparse.Namespace(device="cpu", batch_size=None))
    with mock.patch.object(sys, "argv", ["radio-lit"]):
        cli = harness.build(harness.QUICKSTART, overrides, max_steps=1)
    return cli


def test_fake_step_counts_what_the_real_step_runs(quickstart):
    module, data = quickstart.model, quickstart.datamodule
    batch = module.partitions.rank_batch_size() or data.batch_size
    fake = copy.deepcopy(module)
    torch.manual_seed(0)
    with (
        FlopCounterMode(display=False) as flops,
        profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof,
    ):
        real = count_step(
            module, contextlib.nullcontext(), data.crop_size, batch, None, gpu_attention=False
        )
    measured_peak = _profiled_peak(prof)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_module(fake, mode)
    torch.manual_seed(0)
    predicted = count_step(fake, mode, data.crop_size, batch, None, gpu_attention=False)

    assert predicted.total_flops == flops.get_total_flops() > 0
    assert predicted.flops == real.flops  # the same parts, fake or real
    assert set(predicted.images) == set(module.partitions.partitions)
    assert abs(predicted.peak_bytes / measured_peak - 1) <= 0.15, (
        predicted.peak_bytes,
        measured_peak,
    )
