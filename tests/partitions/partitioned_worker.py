"""Training runs with uneven partition layouts, on 1 process or on one gloo rank of several.

Usage (one process per rank, launched by ``tests.distributed.gloo.run_gloo_workers``)::

    python partitioned_worker.py RANK WORLD_SIZE INIT_FILE layouts PLAN OUTPUT
    python partitioned_worker.py RANK WORLD_SIZE INIT_FILE resume PHASE RUN_DIR OUTPUT

The process group is initialized here (gloo, through the init file) and Lightning's
``DDPStrategy(broadcast_buffers=False)`` takes it over (``LOCAL_RANK`` set: Lightning launches
nothing). Every rank trains on its own list of crops, cut from one global set so that a
1-process run of the same plan (:func:`train` with ``world_size=1``) sees the same images per
partition; see :func:`rank_batches`.

- ``layouts``: for every balancer of :data:`BALANCERS`, a run of :data:`STEPS` SGD steps with
  ZCA whitening estimated over the first steps and a validation epoch at the end; saves
  ``{balancer: result}`` (:func:`train`).
- ``resume``: the :data:`PLANS` ``"three"`` plan with PHI-S statistics estimated over every
  step and refitted every :data:`REFIT_EVERY` steps, a checkpoint after every step. Phase
  ``full`` trains :data:`RESUME_STEPS` steps; ``killed`` SIGKILLs every rank at the start of
  step :data:`KILL_AT` (the checkpoint of the step before is the last one written, between two
  refits); ``resumed`` continues from that checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader
from torchdata.stateful_dataloader import StatefulDataLoader

from radio_lit.callbacks import TeacherStatsEstimation
from radio_lit.losses import AdaLoss, TeacherDropping, Uncertainty, Weighted
from radio_lit.module import DistillationModule
from radio_lit.normalizers import PhiS, ZCAWhiten
from radio_lit.training.partitions import Partition
from tests.builders import cpu_trainer, tiny_module, tiny_student
from tests.distributed.gloo import join_gloo

SEED = 0
IMAGES = 4  # per partition and step
CROP = 64
STEPS = 3
ESTIMATION = 2  # statistics estimated over steps 0 and 1, refitted at each
RESUME_STEPS = 4
REFIT_EVERY = 3  # refits at steps 0 and 3 (the last estimation step)
KILL_AT = 2  # the last checkpoint is step 1's: after the refit at 0, before the one at 3

#: Uneven layouts (partition p runs on rank p mod W): ``three`` on 2 ranks runs [2, 1] chunks
#: per rank, DINOv2 twice on rank 0 and SAM only on rank 1; ``four`` on 3 ranks runs [2, 1, 1].
PLANS: dict[str, dict[str, list[str]]] = {
    "three": {"a": ["clip", "dino"], "b": ["dino", "sam"], "c": ["dino"]},
    "four": {"a": ["clip"], "b": ["dino"], "c": ["sam"], "d": ["dino", "sam"]},
}
WORLD_SIZES = {"three": 2, "four": 3}
BALANCERS: dict[str, Any] = {
    "weighted": Weighted,
    "adaloss": lambda terms: AdaLoss(terms, momentum=0.5),
    "uncertainty": Uncertainty,
    # p = 1 keeps only each image's hardest teacher: no dependence on the random draws, whose
    # order differs between layouts.
    "teacher_dropping": lambda terms: TeacherDropping(terms, p=1.0),
}


def _sgd(params: Any) -> torch.optim.Optimizer:
    """Plain SGD: the update is proportional to the gradient (Adam would hide a scale)."""
    return torch.optim.SGD(params, lr=0.5)


def build(plan: str, balancer: str, normalizer: Any = ZCAWhiten) -> DistillationModule:
    """The tiny module with ``plan``'s partitions, built from the same seed everywhere."""
    torch.manual_seed(SEED)
    student = tiny_student(cpe_min_scale=1.0, cpe_max_aspect=1.0)  # deterministic CPE
    partitions = {
        name: Partition(teachers=teachers, batch_size=IMAGES)
        for name, teachers in PLANS[plan].items()
    }
    return tiny_module(
        student=student,
        normalizer=normalizer,
        partitions=partitions,
        optimizer=_sgd,
        balancer=BALANCERS[balancer],
    )


def global_images(plan: str, steps: int) -> torch.Tensor:
    """``[steps, P, IMAGES, 3, CROP, CROP]`` uint8: step s's images of partition p."""
    generator = torch.Generator().manual_seed(SEED)
    shape = (steps, len(PLANS[plan]), IMAGES, 3, CROP, CROP)
    return torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator)


def rank_batches(plan: str, steps: int, rank: int, world_size: int) -> list[torch.Tensor]:
    """Rank ``rank``'s batch of each step: its partitions' images in partition order."""
    images = global_images(plan, steps)
    mine = [p for p in range(len(PLANS[plan])) if p % world_size == rank]
    return [torch.cat([images[s, p] for p in mine]) for s in range(steps)]


def val_batches(rank: int, world_size: int) -> list[torch.Tensor]:
    """One validation batch per rank of a 3-rank run, shared out over ``world_size`` ranks."""
    generator = torch.Generator().manual_seed(SEED + 1)
    batches = torch.randint(0, 256, (3, 2, 3, CROP, CROP), dtype=torch.uint8, generator=generator)
    return [batches[i] for i in range(3) if i % world_size == rank]


def _trainer(root: Path, world_size: int, **overrides: Any) -> Trainer:
    if world_size == 1:
        return cpu_trainer(root, **overrides)
    from lightning.pytorch.strategies import DDPStrategy

    os.environ["WORLD_SIZE"] = str(world_size)  # Lightning's environment removes it at teardown
    strategy = DDPStrategy(
        process_group_backend="gloo", broadcast_buffers=False, timeout=timedelta(seconds=60)
    )
    return cpu_trainer(
        root, devices=world_size, strategy=strategy, use_distributed_sampler=False, **overrides
    )


def _loader(batches: list[torch.Tensor]) -> DataLoader:
    return DataLoader(batches, batch_size=None)


def _state(module: DistillationModule) -> dict[str, Any]:
    return {
        "weights": {k: p.detach().clone() for k, p in module.trainable_parameters()},
        "normalizers": {
            n: {k: v.clone() for k, v in m.state_dict().items()}
            for n, m in module.normalizers.items()
        },
        "balancer": {k: v.clone() for k, v in module.balancer.state_dict().items()},
    }


def train(plan: str, balancer: str, rank: int, world_size: int, root: Path) -> dict[str, Any]:
    """Train ``plan`` with ``balancer`` on this rank; weights, statistics, balancer state and
    the validation values (``val/...``, reduced over the ranks) at the end."""
    module = build(plan, balancer)
    trainer = _trainer(
        root,
        world_size,
        max_steps=STEPS,
        callbacks=[TeacherStatsEstimation(steps=ESTIMATION, refit_every=1)],
    )
    trainer.fit(
        module,
        _loader(rank_batches(plan, STEPS, rank, world_size)),
        _loader(val_batches(rank, world_size)),
    )
    values = {k: v.clone() for k, v in trainer.callback_metrics.items() if k.startswith("val/")}
    return {**_state(module), "val": values}


class _KillAt(Callback):
    """SIGKILL this process at the start of step ``step`` (no teardown, no last save)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step == self.step:
            os.kill(os.getpid(), signal.SIGKILL)


def resume(phase: str, rank: int, world_size: int, run_dir: Path) -> dict[str, Any]:
    """One phase of the resume test (module docstring); the final state."""
    module = build("three", "weighted", normalizer=PhiS)
    checkpoints = run_dir / "checkpoints"
    callbacks: list[Callback] = [
        TeacherStatsEstimation(steps=RESUME_STEPS, refit_every=REFIT_EVERY),
        ModelCheckpoint(dirpath=checkpoints, save_last=True, save_top_k=0, every_n_train_steps=1),
    ]
    if phase == "killed":
        callbacks.append(_KillAt(KILL_AT))
    trainer = _trainer(
        run_dir,
        world_size,
        max_steps=RESUME_STEPS,
        callbacks=callbacks,
        limit_val_batches=0,
        enable_checkpointing=True,
    )
    ckpt = checkpoints / "last.ckpt" if phase == "resumed" else None
    batches = rank_batches("three", RESUME_STEPS, rank, world_size)
    loader = StatefulDataLoader(batches, batch_size=None)  # Lightning restores its position
    trainer.fit(module, loader, ckpt_path=ckpt)
    return _state(module)


def main(rank: int, world_size: int, init_file: str, mode: str, *args: str) -> None:
    join_gloo(rank, world_size, init_file)
    *options, output = args
    root = Path(output).parent / f"rank{rank}"
    if mode == "layouts":
        (plan,) = options
        result = {b: train(plan, b, rank, world_size, root / b) for b in BALANCERS}
    else:
        phase, run_dir = options
        result = resume(phase, rank, world_size, Path(run_dir))
    torch.save(result, output)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], *sys.argv[4:])
