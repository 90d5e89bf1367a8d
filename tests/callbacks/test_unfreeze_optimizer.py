"""After the frozen-trunk phase the trunk's first update is a fresh optimizer's first step.

PHI-S A.7 (table 10) freezes the student trunk for the first steps of a stage while the heads
train. timm's ``Lamb`` counts steps per parameter group, even for a group without gradients:
if the trunk shared its groups with the heads, or kept its own counter through the frozen
steps, its first moments would start without bias correction and its first updates would be
several times too large. These tests compare the trunk's actual update at the unfreeze step
with the first step of a brand-new optimizer given the same weights, gradients and LR.
"""

from __future__ import annotations

from functools import partial

import lightning.pytorch as pl
import pytest
import torch
from timm.optim import Lamb
from torch import nn

from radio_lit.callbacks import FreezeBody
from radio_lit.training.lamb import Lamb as CompiledLamb
from tests.builders import cpu_trainer, image_batches, tiny_module

FROZEN = 3  # trunk frozen over steps 0-2; step 3 is its first update


class FirstTrunkUpdate(pl.Callback):
    """At the unfreeze step: the optimizer's groups (weights, gradients, LR) before the step,
    and the trunk's weights after it."""

    def __init__(self) -> None:
        super().__init__()
        self.before: list[dict] = []
        self.after: list[torch.Tensor] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if trainer.global_step != FROZEN:
            return
        self.before = [
            {
                **{k: v for k, v in group.items() if k not in ("params", "step")},
                "params": [(p.detach().clone(), p.grad.clone()) for p in group["params"]],
            }
            for group in optimizer.param_groups
        ]

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == FROZEN + 1:
            self.after = [w.detach().clone() for w in trunk_weights(pl_module.parameter_groups())]


def trunk_weights(groups: list[dict]) -> list:
    """The trunk's entries of parameter groups, in group order."""
    return [p for group in groups if group["name"].startswith("trunk") for p in group["params"]]


def fresh_first_step(factory, before: list[dict]) -> list[tuple[str, torch.Tensor]]:
    """A new optimizer's first step on copies of the recorded groups: ``(group, weight)``."""
    groups = []
    for recorded in before:
        params = []
        for weight, grad in recorded["params"]:
            param = nn.Parameter(weight.clone())
            param.grad = grad.clone()
            params.append(param)
        groups.append({**{k: v for k, v in recorded.items() if k != "params"}, "params": params})
    optimizer = factory(groups)
    optimizer.step()
    return [
        (group["name"], p.detach()) for group in optimizer.param_groups for p in group["params"]
    ]


@pytest.mark.parametrize(
    "factory",
    [
        partial(torch.optim.AdamW, lr=1e-3, weight_decay=0.02),
        partial(Lamb, lr=1e-3, weight_decay=0.02),
        partial(CompiledLamb, lr=1e-3, weight_decay=0.02, compiled={"backend": "aot_eager"}),
    ],
    ids=["AdamW", "Lamb", "compiled Lamb"],
)
def test_the_trunk_first_update_is_a_fresh_optimizer_first_step(tmp_path, factory):
    torch.manual_seed(0)
    module = tiny_module(optimizer=factory)
    record = FirstTrunkUpdate()
    trainer = cpu_trainer(
        tmp_path, max_steps=FROZEN + 1, callbacks=[FreezeBody(steps=FROZEN), record]
    )
    trainer.fit(module, image_batches(8, 4))

    assert [group["name"] for group in record.before] == [
        "trunk_decay",
        "trunk_no_decay",
        "heads_decay",
        "heads_no_decay",
    ]
    assert all(group["lr"] > 0 for group in record.before)
    before = [weight for weight, _ in trunk_weights(record.before)]
    expected = [
        w for name, w in fresh_first_step(factory, record.before) if name.startswith("trunk")
    ]
    assert len(expected) == len(record.after) == len(before)
    for weight, want, got in zip(before, expected, record.after, strict=True):
        assert not torch.equal(want, weight)  # a fresh optimizer moves every trunk tensor
        torch.testing.assert_close(got - weight, want - weight, rtol=1e-4, atol=1e-8)
