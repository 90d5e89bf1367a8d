"""``model.init_from`` and the EMA student, which runs for the whole of training (RADIO #181):
a later stage starts its EMA from the earlier stage's, or from the loaded weights when the
earlier checkpoint has none; a stage without ``model.mesa`` leaves it out. (The recipes' own
chains: test_shipped_steps.py.)"""

from __future__ import annotations

import pytest
import torch

from radio_lit.students.ema import MESA
from tests.builders import tiny_module, tiny_student


def _saved(module, path):
    torch.save({"state_dict": module.state_dict()}, path)
    return str(path)


def _ema_equals(module, saved: dict, prefix: str) -> None:
    for key, value in module.ema.state_dict().items():
        torch.testing.assert_close(value, saved[prefix + key], rtol=0, atol=0)


def test_the_ema_goes_on_from_the_earlier_stages_ema(tmp_path):
    torch.manual_seed(0)
    stage1 = tiny_module(mesa=MESA())
    with torch.no_grad():  # the EMA somewhere else than the live weights, as after training
        for parameter in stage1.ema.parameters():
            parameter.add_(1.0)
    saved = stage1.state_dict()
    stage2 = tiny_module(mesa=MESA(), init_from=_saved(stage1, tmp_path / "s1.ckpt"))
    _ema_equals(stage2, saved, "ema.")
    live = stage2.student.pos_embed
    assert not torch.equal(stage2.ema.student.pos_embed, live)


def test_an_earlier_stage_without_ema_starts_it_at_its_weights(tmp_path):
    torch.manual_seed(0)
    stage1 = tiny_module()  # no model.mesa: no ema.* in its checkpoint
    saved = {k: v for k, v in stage1.state_dict().items() if k.startswith(("student.", "heads."))}
    stage2 = tiny_module(mesa=MESA(), init_from=_saved(stage1, tmp_path / "s1.ckpt"))
    _ema_equals(stage2, saved, "")


def test_a_stage_without_mesa_leaves_the_earlier_ema_out(tmp_path):
    torch.manual_seed(0)
    stage1 = tiny_module(mesa=MESA())
    stage2 = tiny_module(init_from=_saved(stage1, tmp_path / "s1.ckpt"))
    assert stage2.ema is None
    torch.testing.assert_close(stage2.student.pos_embed, stage1.student.pos_embed)


def test_another_token_count_is_one_line_naming_the_fix(tmp_path):
    """C-RADIOv4 on main: 2 summary tokens in stage 2, 3 once SAM3 joins in stage 3."""
    stage2 = tiny_module(student=tiny_student(num_cls_tokens=2))
    checkpoint = _saved(stage2, tmp_path / "s2.ckpt")
    with pytest.raises(ValueError) as error:
        tiny_module(student=tiny_student(num_cls_tokens=3), init_from=checkpoint)
    message = str(error.value)
    assert "\n" not in message and "student.cls_token is [1, 2, 32]" in message
    assert "but [1, 3, 32] here" in message and "summary_tokens" in message
