"""The EMA update under FSDP2 with a bf16 MixedPrecisionPolicy, at world size
1 and 2 on CPU/gloo (runs ``fsdp2_ema_worker.py``), and on one CUDA device with Lightning's
bf16-mixed precision when a GPU is present; the student's output visible to FSDP2."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch

from tests.distributed.gloo import run_gloo_workers

WORKER = Path(__file__).with_name("fsdp2_ema_worker.py")


@pytest.mark.distributed
@pytest.mark.parametrize("world_size", [1, 2])
def test_the_ema_follows_a_bf16_fsdp2_student_whose_roots_stay_gathered(tmp_path, world_size):
    """After no-grad forwards both FSDP2 roots hold plain gathered tensors: the update before
    the fix lerped DTensors with plain tensors (the GPU run's error); now both sides are
    resharded, the EMA is the exact moving average, and a mismatched pair is one clear line."""
    for result in run_gloo_workers(WORKER, tmp_path, world_size=world_size):
        assert result["compute_dtype"] == "torch.bfloat16"  # the policy is in force
        assert result["live_kinds"] == ["Parameter"]  # gathered, not DTensor
        assert "got mixed torch.Tensor and DTensor" in result["old_error"]
        assert result["close"]
        assert result["mismatch"].startswith("EMA update: ema.pos_embed is a DTensor")
        assert "but the live parameter a plain" in result["mismatch"]


def test_a_students_output_shows_fsdp2_its_tensors():
    """FSDP2 in torch <= 2.13 flattens a sharded module's output as a pytree to hook its
    backward: a student output that is one opaque leaf leaves the gradients unreduced and the
    sharded weights untrained (seen with torch 2.11 on an H200 and on CPU)."""
    from torch.utils._pytree import tree_flatten

    from radio_lit.students.base import StudentOutput

    summary, features = torch.zeros(2, 1, 4), torch.zeros(2, 3, 3, 4)
    leaves, _ = tree_flatten(StudentOutput(summary, features))
    assert len(leaves) == 2 and leaves[0] is summary and leaves[1] is features


def _full(tensor: torch.Tensor) -> torch.Tensor:
    tensor = tensor.detach()
    full = tensor.full_tensor() if hasattr(tensor, "full_tensor") else tensor
    return full.float().cpu().clone()  # at world size 1 a full tensor can be the shard itself


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_ema_updates_under_model_parallel_bf16_on_one_cuda_device(tmp_path, monkeypatch):
    """The issue's path: radio_lit.distributed.strategies.ModelParallelStrategy on one CUDA device,
    bf16-mixed, an EMA student with MESA, two optimizer steps. Each update is checked where it
    happens (the live weights moved; the EMA is the exact lerp towards them), then the EMA
    read after ``fit``. On an H200 with torch 2.11 the EMA read after ``fit`` equalled its
    start: the live student had not moved (its output was opaque to FSDP2: the test above);
    the same run on CPU with torch 2.11 passes since the fix."""
    from radio_lit.distributed.strategies import ModelParallelStrategy
    from radio_lit.students.ema import MESA, EMAStudent, _reshard
    from tests.builders import cpu_trainer, image_batches, tiny_module

    updates = []
    update = EMAStudent.update

    def recorded(ema: EMAStudent, student: torch.nn.Module, heads: torch.nn.Module) -> None:
        _reshard(ema)  # after the MESA forward the root holds gathered bf16 copies
        before = _full(ema.student.patch_embed.proj.weight)
        update(ema, student, heads)
        live = _full(student.patch_embed.proj.weight)
        updates.append((before, live, _full(ema.student.patch_embed.proj.weight)))

    monkeypatch.setattr(EMAStudent, "update", recorded)
    torch.manual_seed(0)
    module = tiny_module(mesa=MESA(decay=0.5))
    start = _full(module.student.patch_embed.proj.weight)
    strategy = ModelParallelStrategy(
        data_parallel_size=1, tensor_parallel_size=1, timeout=timedelta(seconds=120)
    )
    trainer = cpu_trainer(
        tmp_path, accelerator="gpu", devices=1, strategy=strategy, precision="bf16-mixed"
    )
    trainer.fit(module, image_batches())
    assert len(updates) == 2, "the EMA follows every optimizer step"
    assert not torch.equal(updates[-1][1], start), "the live student did not move"
    for before, live, after in updates:
        torch.testing.assert_close(after, 0.5 * before + 0.5 * live)  # decay 0.5
    assert not torch.equal(updates[-1][2], start), "the EMA did not move"
    torch.testing.assert_close(_full(module.ema.student.patch_embed.proj.weight), updates[-1][2])
