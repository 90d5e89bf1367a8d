"""The EMA student and MESA while FreezeBody holds the trunk (PHI-S A.7's frozen body steps in
every stage; C-RADIOv4's EMA runs for the whole run, RADIO #181).

The rule: the EMA averages what trains. While the trunk is held, the EMA of the trunk is held
too (no step toward weights that do not train: the average carried from the earlier stage
survives the frozen steps whole, where following them would keep 0.9996^5000 ≈ 13.5 % of it),
the EMA of the heads follows the heads, and MESA's EMA forward is skipped when its gradient
would reach the trunk only (``applies_to: backbone``), as FreezeBody drops that gradient.
"""

from __future__ import annotations

import lightning.pytorch as pl
import pytest
import torch
from torch import nn

from radio_lit.callbacks import FreezeBody
from radio_lit.students.ema import MESA, EMAStudent
from tests.builders import cpu_trainer, image_batches, tiny_module

FROZEN = 2  # steps 0 and 1 hold the trunk; step 2 trains it


def test_an_ema_update_without_the_trunk_holds_the_trunks_average():
    student, heads = nn.Linear(3, 2), nn.ModuleDict({"t": nn.Linear(2, 2)})
    student.register_buffer("state", torch.zeros(2))
    ema = EMAStudent(student, heads, decay=0.5)
    trunk = {k: v.clone() for k, v in ema.student.state_dict().items()}
    with torch.no_grad():
        for module in (student, heads):
            for parameter in module.parameters():
                parameter.add_(2.0)
        student.state.fill_(7.0)
    ema.update(student, heads, trunk=False)
    assert all(torch.equal(v, ema.student.state_dict()[k]) for k, v in trunk.items())
    torch.testing.assert_close(ema.heads["t"].weight, heads["t"].weight - 1.0)  # halfway
    ema.update(student, heads)  # a step that trains the trunk: it follows again
    torch.testing.assert_close(ema.student.weight, student.weight - 1.0)
    assert ema.student.state.tolist() == [7.0, 7.0]


class EMAProbe(pl.Callback):
    """The EMA's trunk and heads before each step, and the EMA forwards each step ran."""

    def __init__(self) -> None:
        self.trunk: list[dict[str, torch.Tensor]] = []
        self.heads: list[dict[str, torch.Tensor]] = []
        self.forwards: list[int] = []

    def on_fit_start(self, trainer, pl_module) -> None:
        pl_module.ema.student.register_forward_hook(self._count)

    def _count(self, *args) -> None:
        self.forwards[-1] += 1

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._record(pl_module)
        self.forwards.append(0)

    def on_train_end(self, trainer, pl_module) -> None:
        self._record(pl_module)

    def _record(self, module) -> None:
        self.trunk.append({k: v.clone() for k, v in module.ema.student.state_dict().items()})
        self.heads.append({k: v.clone() for k, v in module.ema.heads.state_dict().items()})


def _equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(v, b[k]) for k, v in a.items())


def _train(tmp_path, applies_to: str) -> EMAProbe:
    torch.manual_seed(0)
    module = tiny_module(mesa=MESA(decay=0.5, applies_to=applies_to))
    with torch.no_grad():  # a carried EMA (model.init_from), away from the live weights
        for parameter in module.ema.parameters():
            parameter.add_(0.5)
    probe = EMAProbe()
    trainer = cpu_trainer(tmp_path, max_steps=FROZEN + 1, callbacks=[FreezeBody(FROZEN), probe])
    trainer.fit(module, image_batches(16, 4))
    assert module.student_step.trunk_frozen is False  # nothing is held after the run
    return probe


def test_the_frozen_steps_hold_the_trunks_ema_and_skip_mesas_forward(tmp_path):
    probe = _train(tmp_path, "backbone")
    # the carried trunk average, bit for bit, through the frozen steps; the heads' follows
    assert _equal(probe.trunk[0], probe.trunk[1]) and _equal(probe.trunk[0], probe.trunk[FROZEN])
    assert not _equal(probe.heads[0], probe.heads[1])
    # the first step that trains the trunk moves its average
    assert not _equal(probe.trunk[FROZEN], probe.trunk[FROZEN + 1])
    # MESA on the backbone: its gradient reaches the trunk only, so no EMA forward while held
    assert probe.forwards[:FROZEN] == [0] * FROZEN and probe.forwards[FROZEN] > 0


@pytest.mark.parametrize("applies_to", ["heads", "both"])
def test_mesa_on_the_heads_runs_while_the_trunk_is_held(tmp_path, applies_to):
    """The heads train during the frozen steps, and MESA's gradient on their outputs reaches
    them: its EMA forward runs (on the held trunk average)."""
    probe = _train(tmp_path, applies_to)
    assert all(count > 0 for count in probe.forwards)
    assert _equal(probe.trunk[0], probe.trunk[FROZEN])
