"""TrainingProgressGuard: a run whose update trains nothing stops at that update, naming the
parameters, the step and the cause, before a checkpoint of the step is written."""

from __future__ import annotations

from functools import partial

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from radio_lit.callbacks import FreezeBody, NonFiniteGuard, TrainingProgressGuard
from radio_lit.core.errors import NoTrainingProgress
from tests.builders import cpu_trainer, image_batches, tiny_module


def fit(tmp_path, module, *callbacks, max_steps=4):
    checkpoints = ModelCheckpoint(
        dirpath=tmp_path / "checkpoints", save_last=True, every_n_train_steps=1, save_top_k=0
    )
    options = dict(max_steps=max_steps, enable_checkpointing=True)
    trainer = cpu_trainer(tmp_path, callbacks=[*callbacks, checkpoints], **options)
    trainer.fit(module, image_batches(8, 4))
    return trainer


def saved_step(tmp_path) -> int | None:
    last = tmp_path / "checkpoints" / "last.ckpt"
    return torch.load(last, weights_only=True)["global_step"] if last.exists() else None


def test_a_training_run_passes_every_check(tmp_path):
    """Heads checked at step 0, the trunk when FreezeBody releases it (step 2), every group
    again at step 2 (every_n_steps=2); the run trains to its end."""
    torch.manual_seed(0)
    guard = TrainingProgressGuard(every_n_steps=2)
    callbacks = FreezeBody(steps=2), guard, NonFiniteGuard()
    trainer = fit(tmp_path, tiny_module(), *callbacks, max_steps=5)
    assert trainer.global_step == 5
    assert guard._verified == {"trunk_decay", "trunk_no_decay", "heads_decay", "heads_no_decay"}


def test_a_learning_rate_of_0_stops_the_first_update(tmp_path):
    module = tiny_module(optimizer=partial(torch.optim.AdamW, lr=0.0))
    with pytest.raises(NoTrainingProgress) as stopped:
        fit(tmp_path, module, TrainingProgressGuard())
    message = str(stopped.value)
    assert "\n" not in message
    assert message.startswith("no training progress at step 0: ")
    assert "parameter group 'trunk_decay'" in message and "learning rate is 0" in message
    assert "student.patch_generator" in message or "student." in message
    assert saved_step(tmp_path) is None  # no checkpoint of the step that trained nothing


class CutBlock(pl.Callback):
    """Cuts the student's first block from the graph: its output is detached."""

    def on_fit_start(self, trainer, pl_module):
        pl_module.student.blocks[0].register_forward_hook(lambda m, i, out: out.detach())


def test_a_student_part_cut_from_the_graph_stops_when_the_trunk_is_released(tmp_path):
    """The heads train while the trunk is frozen (steps 0-1, checkpointed); at step 2 the
    trunk's first update finds the parameters before the cut without a gradient."""
    torch.manual_seed(0)
    with pytest.raises(NoTrainingProgress) as stopped:
        fit(tmp_path, tiny_module(), CutBlock(), FreezeBody(steps=2), TrainingProgressGuard())
    message = str(stopped.value)
    assert message.startswith("no training progress at step 2: student.")
    assert "blocks.0." in message
    assert "got no gradient or an all-zero one: not reached by the backward pass" in message
    assert "FSDP2" in message and "blocks.1." not in message.split(" got no gradient")[0]
    assert saved_step(tmp_path) == 2  # the heads' two steps, not the failed third


class ZeroLearningRate(pl.Callback):
    """Sets the heads' learning rate to 0 from step ``step`` on."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step >= self.step:
            for group in trainer.optimizers[0].param_groups:
                if group["name"].startswith("heads"):
                    group["lr"] = 0.0


def test_a_group_that_stops_moving_is_caught_at_the_next_check(tmp_path):
    torch.manual_seed(0)
    guard = TrainingProgressGuard(every_n_steps=2)
    stopped = r"at step 4: the parameters of parameter group 'heads_decay' \(heads\..*\) "
    with pytest.raises(NoTrainingProgress, match=stopped + r"stopped changing \(learning rate 0\)"):
        fit(tmp_path, tiny_module(), ZeroLearningRate(step=3), guard, max_steps=6)
    assert saved_step(tmp_path) == 4


def test_a_skipped_step_is_not_judged(tmp_path):
    """NonFiniteGuard dropping a bad step's gradients is no lack of progress."""
    from tests.callbacks.test_guard import PoisonGradient

    torch.manual_seed(0)
    guard = TrainingProgressGuard(every_n_steps=1)
    fit(tmp_path, tiny_module(), PoisonGradient(step=1), NonFiniteGuard(max_skipped_steps=1), guard)
    assert saved_step(tmp_path) == 4


class ZeroInitializedHead(pl.Callback):
    """Starts every feature head's last layer at zero (an output that starts at 0): the
    layers before it get exactly zero gradients at the first update only."""

    def on_fit_start(self, trainer, pl_module):
        for pair in pl_module.heads.values():
            torch.nn.init.zeros_(pair.features.out.weight)
            torch.nn.init.zeros_(pair.features.out.bias)


def test_a_zero_initialized_output_layer_trains_without_a_stop(tmp_path):
    """Zero gradients that reached the parameters are judged again at the next updates."""
    torch.manual_seed(0)
    guard = TrainingProgressGuard(every_n_steps=0)
    trainer = fit(tmp_path, tiny_module(), ZeroInitializedHead(), guard, max_steps=4)
    assert trainer.global_step == 4
    assert {"heads_decay", "heads_no_decay"} <= guard.checked_groups


class MultipliedByZero(pl.Callback):
    """Multiplies the student's first block's output by 0: its gradients stay all zero."""

    def on_fit_start(self, trainer, pl_module):
        pl_module.student.blocks[0].register_forward_hook(lambda m, i, out: 0 * out)


def test_gradients_that_stay_zero_stop_the_run_after_the_grace_updates(tmp_path):
    from radio_lit.callbacks.progress_guard import ZERO_GRADIENT_UPDATES

    torch.manual_seed(0)
    with pytest.raises(NoTrainingProgress, match="got no gradient or an all-zero one") as stop:
        fit(tmp_path, tiny_module(), MultipliedByZero(), TrainingProgressGuard(), max_steps=8)
    assert f"at step {ZERO_GRADIENT_UPDATES}:" in str(stop.value)
    assert "blocks.0." in str(stop.value)
