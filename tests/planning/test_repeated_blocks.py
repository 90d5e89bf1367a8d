"""Each distinct block counted once and replayed (:mod:`radio_lit.planning.repeated_blocks`)
counts what counting every block counts: a timm ViT's step on fake tensors, exactly; a block
that reads a tensor from elsewhere is counted in full. The shipped configs' steps (σReparam,
DAMP, MESA, ViTDet, SAM3 and DINOv3 teachers, bf16 autocast):
``tests/configs/test_shipped_plans.py``."""

from __future__ import annotations

import contextlib

import pytest
import timm
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from radio_lit.planning.counting import BACKWARD, StepCounter, fake_module
from radio_lit.planning.repeated_blocks import BlockRecords, repeated_blocks


def _step(model, images, records, autocast=None):
    """A forward and backward of ``model`` under a fresh counter; each distinct block replayed
    from ``records`` (``None``: every block counted)."""
    counter = StepCounter()
    replaying = repeated_blocks(model, counter, records) if records else contextlib.nullcontext()
    precision = torch.autocast("cpu", autocast) if autocast else contextlib.nullcontext()
    with counter, replaying:
        with counter.part("forward"), precision:
            loss = model(images).float().square().mean()
        with counter.part(BACKWARD):
            loss.backward()
    for parameter in model.parameters():
        parameter.grad = None
    return counter


@pytest.fixture
def vit():
    model = timm.create_model("vit_tiny_patch16_224", depth=4, img_size=64, num_classes=0)
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fake_module(model, mode)
    with mode:
        images = torch.empty(2, 3, 64, 64)
    return model, images


@pytest.mark.parametrize("autocast", [None, torch.bfloat16])
def test_a_replayed_vit_step_counts_what_every_block_counts(vit, autocast):
    model, images = vit
    full = _step(model, images, None, autocast)
    records = BlockRecords()
    replayed = _step(model, images, records, autocast)
    assert (records.probes, records.replays) == (1, 4)  # four alike blocks: one probe
    assert replayed.flops == full.flops and full.flops[BACKWARD] > 0
    assert replayed.ops.gemms == full.ops.gemms
    assert replayed.ops.attention == full.ops.attention
    assert replayed.peak == full.peak
    if autocast is None:  # under autocast the probe casts each use (its cache off)
        assert replayed.ops.moved == full.ops.moved
        assert replayed.ops.calls == full.ops.calls
    again = _step(model, images, records, autocast)  # a later count: replayed from the start
    assert (records.probes, records.replays) == (1, 8)
    assert again.flops == full.flops and again.peak == full.peak


class _Reads(nn.Module):
    """A block that reads a trainable tensor it does not own (shared from outside)."""

    def __init__(self, shared: torch.Tensor) -> None:
        super().__init__()
        self.shared = [shared]
        self.linear = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) * self.shared[0]


def test_a_block_reading_from_elsewhere_is_counted_in_full():
    mode = FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        x, shared = torch.empty(4, 8), nn.Parameter(torch.empty(8))
    model = nn.Sequential(nn.Sequential(*(_Reads(shared) for _ in range(3))))
    fake_module(model, mode)
    full = _step(model, x, None)
    records = BlockRecords()
    replayed = _step(model, x, records)
    assert records.replays == 0 and set(records.records.values()) == {None}
    assert replayed.flops == full.flops and replayed.peak == full.peak
