"""NonFiniteGuard: a diverging run stops with its cause and never saves non-finite state."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from radio_lit.callbacks import NonFiniteGuard
from radio_lit.core.errors import TrainingStopped
from tests.builders import cpu_trainer, image_batches, tiny_module
from tests.distributed.gloo import run_gloo_workers


def fit(tmp_path, module, *callbacks, max_steps=4):
    checkpoints = ModelCheckpoint(
        dirpath=tmp_path / "checkpoints", save_last=True, every_n_train_steps=1, save_top_k=0
    )
    trainer = cpu_trainer(
        tmp_path,
        max_steps=max_steps,
        enable_checkpointing=True,
        callbacks=[*callbacks, checkpoints],
    )
    trainer.fit(module, image_batches(8, 4))
    return trainer


def all_finite_checkpoint(path) -> bool:
    state = torch.load(path, weights_only=True)["state_dict"]
    return all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


def test_a_diverging_run_stops_naming_the_step_and_the_terms(tmp_path):
    torch.manual_seed(0)
    module = tiny_module(optimizer=partial(torch.optim.AdamW, lr=1e12))
    with pytest.raises(TrainingStopped) as stopped:
        fit(tmp_path, module, NonFiniteGuard())
    message = str(stopped.value)
    # step 0's update blows the weights up; step 1's loss is the first non-finite one
    assert "non-finite gradients at step 1" in message
    assert "clip/feature_loss" in message and "sam/feature_loss" in message
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True)["global_step"] == 1
    assert all_finite_checkpoint(last)


def test_a_teacher_with_broken_weights_is_named(tmp_path):
    torch.manual_seed(0)
    module = tiny_module()
    with torch.no_grad():
        next(module.teachers["dino"].parameters()).fill_(float("nan"))
    with pytest.raises(TrainingStopped, match=r"step 0: teacher output\(s\) dino\.features"):
        fit(tmp_path, module, NonFiniteGuard())
    assert not (tmp_path / "checkpoints" / "last.ckpt").exists()


class PoisonGradient(pl.Callback):
    """A NaN in one head gradient at ``step`` only: an isolated bad step."""

    def __init__(self, step: int) -> None:
        super().__init__()
        self.step = step
        self.heads_before: torch.Tensor | None = None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if trainer.global_step == self.step:
            weight = pl_module.heads["clip"].features.out.weight
            weight.grad[0, 0] = float("nan")
            self.heads_before = weight.detach().clone()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.step + 1:
            weight = pl_module.heads["clip"].features.out.weight
            assert torch.equal(weight, self.heads_before), "the bad step's update was applied"


def test_isolated_bad_steps_are_skipped_counted_and_checkpointed(tmp_path):
    torch.manual_seed(0)
    guard = NonFiniteGuard(max_skipped_steps=1)
    fit(tmp_path, tiny_module(), PoisonGradient(step=1), guard)
    assert guard.skipped_steps == 1
    last = torch.load(tmp_path / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 4
    assert last["callbacks"]["NonFiniteGuard"] == {"skipped_steps": 1}
    assert all_finite_checkpoint(tmp_path / "checkpoints" / "last.ckpt")

    with pytest.raises(TrainingStopped, match=r"gradients of heads\.clip\.features\.out\.weight"):
        fit(tmp_path / "strict", tiny_module(), PoisonGradient(step=1), NonFiniteGuard())


def test_a_non_finite_gradient_on_one_rank_stops_every_rank(tmp_path):
    """The ranks' finiteness flags are reduced on the device (their minimum) and read once."""
    verdicts = run_gloo_workers(Path(__file__).with_name("guard_worker.py"), tmp_path)
    assert verdicts == [[False, True], [False, True]]


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), -float("inf")])
def test_the_finiteness_check_sees_any_element_of_any_dtype_in_a_few_operations(bad):
    """One value in one of 200 gradients (float32 and bf16) makes the flag 0; the check
    dispatches 6 top-level operations whatever the number of tensors (one fused norm per dtype,
    no per-tensor ``detach``)."""
    from benchmarks.dispatch import count_operations
    from radio_lit.callbacks.guard import finite_flag

    grads = [torch.randn(8, 8) for _ in range(150)] + [
        torch.randn(16).bfloat16() for _ in range(50)
    ]
    if bad is not None:
        grads[170][3] = bad
    flag, count = count_operations(lambda: finite_flag(grads))
    assert flag.item() == (0.0 if bad is not None else 1.0)
    assert count.top_level <= 6, count.by_name
    assert finite_flag([torch.zeros(3, dtype=torch.long)]) is None


@pytest.mark.parametrize("bad", [None, float("nan"), -float("inf")])
def test_a_checkpoint_with_non_finite_values_is_refused_naming_them(tmp_path, bad):
    """A checkpoint's weights and statistics (float32 and float64) are checked before it is
    written: a NaN / Inf in any of them is refused naming where it is; a finite one costs a
    few operations whatever the number of tensors (not a check and a read per tensor, which
    under FSDP2 is a collective per tensor)."""
    from benchmarks.dispatch import count_operations

    state = {f"student.blocks.{i}.weight": torch.randn(4, 4) for i in range(100)}
    state |= {"normalizers.clip.m2": torch.ones(3, 3, dtype=torch.float64)}
    state |= {"normalizers.clip.count": torch.tensor(3), "heads.clip.bias": None}
    if bad is not None:
        state["student.blocks.7.weight"][1, 2] = bad
        state["normalizers.clip.m2"][0, 1] = bad
    save = partial(NonFiniteGuard().on_save_checkpoint, cpu_trainer(tmp_path), None)
    if bad is None:
        _, count = count_operations(lambda: save({"state_dict": state}))
        assert count.top_level <= 8, count.by_name
        return
    with pytest.raises(TrainingStopped) as stopped:
        save({"state_dict": state})
    assert (
        "refusing to write a checkpoint with non-finite values in student.blocks.7.weight, "
        "normalizers.clip.m2;" in str(stopped.value)
    )
