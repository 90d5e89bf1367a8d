"""C-RADIOv4's two resolution partitions at CPU sizes, laid out on blocks of ranks or balanced.

Usage (one process per rank, launched by ``tests.distributed.gloo.run_gloo_workers``)::

    python balanced_worker.py RANK WORLD_SIZE INIT_FILE layouts RUN_DIR OUTPUT
    python balanced_worker.py RANK WORLD_SIZE INIT_FILE resumed RUN_DIR OUTPUT

The recipe's shape (configs/recipes/c-radio/stage1.yaml, C-RADIOv4 report 2.2): two partitions
of every teacher (a CLIP and a DINOv2 following the student's resolution), ``low`` of
:data:`LOW` images a step drawn at 32 or 48 px, ``high`` of :data:`HIGH` at 64 px [the high
partition draws one resolution: on blocks its ranks would draw from the same generator state
as the low ranks, so a second resolution would be drawn differently by the two layouts]. On 2
ranks the block layout gives ``low`` to rank 0 and ``high`` to rank 1; the balanced one gives
every rank 2 low and 1 high images. Both see the same images (:func:`rank_batches`).
The module draws nothing per rank (no view shifts, DAMP or CPE windows: each rank's own
streams would draw them differently for an image on another rank), so the layouts' steps can
be compared.

- ``layouts``: per balancer of :data:`BALANCERS`, one SGD step of each layout (statistics
  estimated at it, the progress guard on), recording each rank's loss, the averaged gradients
  and the statistics; the balanced one's step again under FSDP2 (``ModelParallelStrategy``,
  the recipe's); then the balanced layout's :data:`STEPS`-step run with a checkpoint
  after every step (PHI-S statistics estimated over every step, refitted every
  :data:`REFIT_EVERY`, and :class:`~radio_lit.callbacks.RandomStates`).
- ``resumed``: the balanced run resumed from its checkpoint after :data:`RESUME_FROM` steps.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from torchdata.stateful_dataloader import StatefulDataLoader

from radio_lit.callbacks import RandomStates, TeacherStatsEstimation, TrainingProgressGuard
from radio_lit.losses import TeacherDropping, Weighted
from radio_lit.module import DistillationModule
from radio_lit.normalizers import PhiS, ZCAWhiten
from radio_lit.training.partitions import Partition
from tests.builders import cpu_trainer, tiny_module, tiny_student
from tests.distributed.gloo import join_gloo
from tests.teachers.tiny import tiny_clip_teacher, tiny_dinov2_teacher

SEED = 0
LOW, HIGH = 4, 2  # images a step (global batches)
CROP = 64
STEPS = 3
REFIT_EVERY = 2
RESUME_FROM = 2  # the checkpoint after step 2 holds accumulators of a refit not yet done
BALANCERS: dict[str, Any] = {
    "weighted": Weighted,
    # p = 1 keeps only each image's hardest teacher: no random draw the layouts would order
    # differently.
    "teacher_dropping": lambda terms: TeacherDropping(terms, p=1.0),
}


def build(every_rank: bool, balancer: str = "weighted", normalizer: Any = ZCAWhiten):
    """The tiny two-partition module, from the same seed everywhere (torch's, numpy's and
    python's generators, as ``seed_everything`` seeds every rank of a run)."""
    seed_everything(SEED, verbose=False)
    student = tiny_student(cpe_min_scale=1.0, cpe_max_aspect=1.0)  # deterministic CPE
    partitions = {
        "low": Partition(batch_size=LOW, resolutions=[32, 48], every_rank=every_rank),
        "high": Partition(batch_size=HIGH, resolutions=[64], every_rank=every_rank),
    }
    teachers = {"clip": tiny_clip_teacher(), "dino": tiny_dinov2_teacher(follow_student=True)}
    return tiny_module(
        student=student,
        teachers=teachers,
        normalizer=normalizer,
        partitions=partitions,
        optimizer=lambda params: torch.optim.SGD(params, lr=0.5),
        balancer=BALANCERS[balancer],
    )


def global_images(steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``[steps, LOW, 3, CROP, CROP]`` and ``[steps, HIGH, ...]`` uint8: each step's images."""
    generator = torch.Generator().manual_seed(SEED)
    low, high = (
        torch.randint(0, 256, (steps, n, 3, CROP, CROP), dtype=torch.uint8, generator=generator)
        for n in (LOW, HIGH)
    )
    return low, high


def rank_batches(every_rank: bool, steps: int, rank: int, world_size: int) -> list[torch.Tensor]:
    """Rank ``rank``'s batch of each step: its rows of each of its partitions, in order."""
    low, high = global_images(steps)
    if world_size == 1:
        return [torch.cat([low[s], high[s]]) for s in range(steps)]
    if not every_rank:  # 2 ranks: low on rank 0, high on rank 1
        return [(low if rank == 0 else high)[s] for s in range(steps)]
    a, b = LOW // world_size, HIGH // world_size
    return [
        torch.cat([low[s, rank * a : (rank + 1) * a], high[s, rank * b : (rank + 1) * b]])
        for s in range(steps)
    ]


def trainer(root: Path, world_size: int, fsdp2: bool = False, **overrides: Any) -> Trainer:
    """A CPU trainer on ``world_size`` gloo ranks: DDP, or FSDP2 (the recipe's
    ``ModelParallelStrategy``)."""
    if world_size == 1:
        return cpu_trainer(root, **overrides)
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

    os.environ["WORLD_SIZE"] = str(world_size)  # Lightning's environment removes it at teardown
    timeout = timedelta(seconds=60)
    strategy = (
        ModelParallelStrategy(
            data_parallel_size=world_size,
            tensor_parallel_size=1,
            process_group_backend="gloo",
            timeout=timeout,
        )
        if fsdp2
        else DDPStrategy(process_group_backend="gloo", broadcast_buffers=False, timeout=timeout)
    )
    return cpu_trainer(
        root, devices=world_size, strategy=strategy, use_distributed_sampler=False, **overrides
    )


class _Record(Callback):
    """The first step's loss on this rank and its gradients (after DDP's average)."""

    def __init__(self) -> None:
        self.loss: torch.Tensor | None = None
        self.grads: dict[str, torch.Tensor] = {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.loss is None:
            self.loss = outputs["loss"].detach().clone()

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if not self.grads:  # FSDP2's shards gathered (a collective on every rank, in order)
            self.grads = {
                k: _full(p.grad) for k, p in pl_module.trainable_parameters() if p.grad is not None
            }


def _full(t: torch.Tensor) -> torch.Tensor:
    full = getattr(t, "full_tensor", None)
    return (full() if full is not None else t).detach().clone()


def statistics(module: DistillationModule) -> dict[str, dict[str, torch.Tensor]]:
    return {
        n: {k: v.clone() for k, v in m.state_dict().items()} for n, m in module.normalizers.items()
    }


def one_step(
    every_rank: bool, balancer: str, rank: int, world_size: int, root: Path, fsdp2: bool = False
) -> dict[str, Any]:
    """One step of a layout: this rank's loss, the averaged gradients, the statistics."""
    module, record = build(every_rank, balancer), _Record()
    callbacks = [TeacherStatsEstimation(steps=1, refit_every=1), TrainingProgressGuard(1), record]
    fit = trainer(root, world_size, fsdp2, max_steps=1, callbacks=callbacks, limit_val_batches=0)
    batches = rank_batches(every_rank, 1, rank, world_size)
    fit.fit(module, StatefulDataLoader(batches, batch_size=None))
    return {"loss": record.loss, "grads": record.grads, "normalizers": statistics(module)}


def run(phase: str, rank: int, world_size: int, run_dir: Path) -> dict[str, Any]:
    """The balanced layout's checkpointed run (``full``) or its resumption (``resumed``)."""
    module = build(True, normalizer=PhiS)
    checkpoints = run_dir / "checkpoints"
    callbacks: list[Callback] = [
        TeacherStatsEstimation(steps=STEPS, refit_every=REFIT_EVERY),
        TrainingProgressGuard(1),
        RandomStates(),
        ModelCheckpoint(
            dirpath=checkpoints, filename="{step}", save_top_k=-1, every_n_train_steps=1
        ),
    ]
    root = run_dir / phase / f"rank{rank}"
    fit = trainer(
        root,
        world_size,
        max_steps=STEPS,
        callbacks=callbacks,
        limit_val_batches=0,
        enable_checkpointing=True,
    )
    ckpt = checkpoints / f"step={RESUME_FROM}.ckpt" if phase == "resumed" else None
    loader = StatefulDataLoader(rank_batches(True, STEPS, rank, world_size), batch_size=None)
    fit.fit(module, loader, ckpt_path=ckpt)
    return {
        "weights": {k: p.detach().clone() for k, p in module.trainable_parameters()},
        "normalizers": statistics(module),
        "rng": torch.get_rng_state(),  # the same draws (resolutions) leave the same state
    }


def main(rank: int, world_size: int, init_file: str, mode: str, run_dir: str, output: str) -> None:
    join_gloo(rank, world_size, init_file)
    folder = Path(run_dir)
    if mode == "layouts":
        result: dict[str, Any] = {
            (layout, b): one_step(layout == "balanced", b, rank, world_size, folder / layout / b)
            for layout in ("blocks", "balanced")
            for b in BALANCERS
        }
        # the recipe's strategy: under FSDP2 every rank runs the same partitions in turn
        result["fsdp2"] = one_step(True, "weighted", rank, world_size, folder / "fsdp2", True)
        result["full"] = run("full", rank, world_size, folder)
    else:
        result = run("resumed", rank, world_size, folder)
    torch.save(result, output)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], *sys.argv[4:])
