"""Optimizers run their fused (else foreach) step by default, on the CPU too, unless the config
chose: the same update as PyTorch's per-parameter loop, in a few operations."""

from __future__ import annotations

from functools import partial

import pytest
import torch
from timm.optim import Lamb

from radio_lit.training.optim import fastest_implementation, parameter_groups
from tests.builders import tiny_module


def groups():
    torch.manual_seed(0)
    return parameter_groups(tiny_module().trainable_parameters())


def implementation(optimizer) -> set:
    """The set of each group's ``(fused, foreach)`` (``foreach`` alone without ``fused``)."""
    if "fused" not in optimizer.defaults:
        return {g["foreach"] for g in optimizer.param_groups}
    return {(g.get("fused"), g.get("foreach")) for g in optimizer.param_groups}


@pytest.mark.parametrize(
    ("factory", "expected"),
    [
        (partial(torch.optim.AdamW, lr=1e-3), {(True, None)}),  # the quickstart's
        (partial(torch.optim.SGD, lr=1e-3), {(True, None)}),
        (partial(torch.optim.NAdam, lr=1e-3), {True}),  # no fused NAdam: foreach
        (partial(torch.optim.AdamW, lr=1e-3, foreach=False), {(None, False)}),  # the config's
        (partial(torch.optim.AdamW, lr=1e-3, fused=False), {(False, None)}),
    ],
)
def test_the_fastest_implementation_unless_the_config_chose(factory, expected):
    optimizer = fastest_implementation(factory(groups()))
    assert implementation(optimizer) == expected
    names = [g["name"] for g in optimizer.param_groups]
    assert names == ["trunk_decay", "trunk_no_decay", "heads_decay", "heads_no_decay"]
    assert [g["weight_decay"] for g in optimizer.param_groups][1::2] == [0.0, 0.0]


def test_timm_lamb_takes_its_foreach_step_and_an_optimizer_without_options_is_kept():
    assert implementation(fastest_implementation(Lamb(groups(), lr=1e-3))) == {True}

    class Plain(torch.optim.SGD):
        def __init__(self, params, lr=0.1):
            super().__init__(params, lr=lr)

    plain = Plain(groups())
    assert fastest_implementation(plain) is plain


def test_the_fused_step_updates_as_the_per_parameter_loop_in_a_few_operations():
    from benchmarks.dispatch import count_operations

    loop_groups, fused_groups = groups(), groups()
    for group in (*loop_groups, *fused_groups):
        group["params"] = [torch.nn.Parameter(p.detach().clone()) for p in group["params"]]
        for p in group["params"]:
            p.grad = torch.randn_like(p, generator=torch.Generator().manual_seed(p.numel()))
    loop = torch.optim.AdamW(loop_groups, lr=1e-2, weight_decay=0.02, foreach=False)
    fused = fastest_implementation(torch.optim.AdamW(fused_groups, lr=1e-2, weight_decay=0.02))
    loop.step(), fused.step()  # the first steps create the state
    loop.step()
    _, count = count_operations(fused.step)
    for a, b in zip(loop_groups, fused_groups, strict=True):
        for p, q in zip(a["params"], b["params"], strict=True):
            torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-7)
    parameters = sum(len(g["params"]) for g in fused_groups)
    assert count.top_level < parameters // 4, count.by_name
