"""A 2-process CPU/gloo training run of DistillationModule, written out per rank for the tests.

The tests fork both ranks at once (``tests/distributed/test_distributed_fit.py``), each calling
:func:`main` with ``LOCAL_RANK``, ``NODE_RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
``MASTER_PORT`` set, as ``torchrun`` or SLURM set them: Lightning then launches nothing. By
hand, as a script, rank 0 re-launches ``sys.argv`` for rank 1 (Lightning's
``_SubprocessScriptLauncher``, DESIGN.md "Distributed rules")::

    PYTHONPATH=<repo root> MASTER_ADDR=127.0.0.1 MASTER_PORT=<free port> \\
        python tests/distributed/distributed_fit.py {ddp|fsdp2|fsdp2-blocks|partitions}[-ema] OUT

- ``ddp``: ``DDPStrategy(process_group_backend="gloo", broadcast_buffers=False)``;
- ``fsdp2``: ``ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)``, so that
  :meth:`DistillationModule.configure_model` shards the student and heads with ``fully_shard``
  (the student one FSDP2 unit, ``FSDP2()``'s layout);
- ``fsdp2-blocks``: ``fsdp2`` with a unit per student block (``FSDP2(layout="blocks")``);
- ``partitions``: DDP as above with two partitions (:func:`build_partitioned_module`), one per
  rank;
- ``<kind>-ema``: ``<kind>`` with an EMA student and its MESA term (``MESA(decay=0.5)``), whose
  weights the rank also writes (``ema``, gathered in full);
- ``<kind>-imported``: started from a published model whose heads are imported
  (:func:`build_imported_module`), so that each refit composes them (sharded under FSDP2);
- ``fsdp2-lr0``: ``fsdp2`` with a learning rate of 0, and ``fsdp2-hidden``: ``fsdp2`` with the
  student's output a dataclass FSDP2 cannot see (``StudentOutput`` taken out of torch's
  pytree registry): runs that train nothing, which ``TrainingProgressGuard`` stops.

Tiny CLIP, DINOv2 and SAM teachers, a tiny CPE ViT student, PHI-S normalizers,
``TeacherStatsEstimation(steps=2, refit_every=1)``, ``FreezeBody(steps=1)``, ``MAX_STEPS``
optimizer steps on synthetic images, ``TrainingProgressGuard(every_n_steps=1)`` checking every
step (``checked_groups``: what it checked). Each rank writes ``rank{R}.pt`` (see
:class:`Recorder`; ``spectral_batches``: how many σReparam layers each computation of
effective weights took together) and then waits at a barrier, so both files exist when rank 0
exits.
"""

from __future__ import annotations

import math
import os
import sys
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch import Tensor

from radio_lit.callbacks import FreezeBody, TeacherStatsEstimation, TrainingProgressGuard
from radio_lit.module import DistillationModule
from radio_lit.normalizers import PhiS
from radio_lit.students import spectral_reparam
from radio_lit.students.ema import MESA
from radio_lit.students.sharding import DEFAULT_FSDP2, FSDP2
from radio_lit.training.partitions import Partition
from tests.builders import cpu_trainer, tiny_module, tiny_student

SEED = 0
# [choice] The fewest steps that hold every phase: a frozen trunk (step 0), estimation steps
# each refitting (0-1), the trunk's first updates (1-2) and a step after estimation (2).
MAX_STEPS = 3
STATS_STEPS = 2  # TeacherStatsEstimation(steps=...)
FREEZE_STEPS = 1  # FreezeBody(steps=...)
BATCH_SIZE = 4  # per rank
NUM_SAMPLES = 32  # 16 per rank: 4 distinct batches per rank, one epoch
CROP_SIZE = 64
TIMEOUT_S = 60  # collectives fail after this instead of gloo's 30 minutes


def build_module(
    seed: int = SEED, mesa: MESA | None = None, fsdp2: FSDP2 = DEFAULT_FSDP2, **overrides: Any
) -> DistillationModule:
    """``tests.builders.tiny_module`` with PHI-S normalizers (tiny CLIP, DINOv2 and SAM
    teachers, SAM without a summary); the same seed builds the same teachers anywhere."""
    torch.manual_seed(seed)
    return tiny_module(normalizer=PhiS, mesa=mesa, fsdp2=fsdp2, **overrides)


def build_imported_module(folder: Path, mesa: MESA | None = None) -> DistillationModule:
    """:func:`build_module` started from a published model (``model.init_from``, NVlabs'
    layout) that ships a head for each of its teachers: heads imported, then composed with
    each refit of the run's PHI-S statistics. Every rank writes the same file (seeded) to a
    path of its own first."""
    from radio_lit.export import module_inference_model, save_radio

    torch.manual_seed(SEED + 1)
    source = tiny_module(student=tiny_student(cpe_align_corners=False), normalizer=PhiS)
    for name, output in source.run_teachers(torch.rand(4, 3, 96, 96)).items():
        source.normalizers[name].update(output.features)
        source.normalizers[name].fit()
    path = folder / f"published{os.environ.get('LOCAL_RANK', 0)}.pth"
    save_radio(module_inference_model(source.eval()), path)
    student = tiny_student(cpe_align_corners=False)
    return build_module(mesa=mesa, student=student, init_from=str(path))


#: Two partitions, one per rank on 2 ranks: DINOv2 is in both (its statistics pool both
#: ranks), CLIP runs on rank 0 only, SAM on rank 1 only.
PARTITIONS = {
    "clip_dino": Partition(teachers=["clip", "dino"], batch_size=BATCH_SIZE),
    "dino_sam": Partition(teachers=["dino", "sam"], batch_size=BATCH_SIZE // 2),
}


def _sgd(params: Any) -> torch.optim.Optimizer:
    """Plain SGD: the step is proportional to the gradient, so a test of the update sees any
    error in the partitions' loss weights (Adam would hide a common scale)."""
    return torch.optim.SGD(params, lr=0.5)


def build_partitioned_module(seed: int = SEED) -> DistillationModule:
    """``build_module`` with :data:`PARTITIONS`, SGD and a deterministic CPE (whole grid),
    so that a 1-process run on the same images takes exactly the same steps."""
    torch.manual_seed(seed)
    student = tiny_student(cpe_min_scale=1.0, cpe_max_aspect=1.0)
    return tiny_module(student=student, normalizer=PhiS, partitions=PARTITIONS, optimizer=_sgd)


def _full(t: Tensor) -> Tensor:
    """A plain CPU copy of ``t``; DTensors are gathered (a collective: every rank calls it)."""
    full = getattr(t, "full_tensor", None)
    return (full() if full is not None else t).detach().cpu().clone()


def _weights(module: DistillationModule) -> dict[str, Tensor]:
    return {name: _full(p) for name, p in module.trainable_parameters()}


class Recorder(Callback):
    """Collects what the test reads; written per rank to ``rank{R}.pt``.

    - ``batches``: the uint8 crops ``[B, 3, S, S]`` this rank trained on while statistics were
      estimated (steps ``0 .. STATS_STEPS - 1``);
    - ``losses``: this rank's training loss at every step;
    - ``weights``: student and head weights (gathered in full) before training (index 0) and
      after every optimizer step (index ``k`` = after ``k`` steps);
    - ``requires_grad``: per step, whether every student/head parameter still required grad;
    - ``wrapped_model``: the class of the model the strategy trains (DDP wraps the module).
    """

    def __init__(self) -> None:
        self.batches: list[Tensor] = []
        self.losses: list[float] = []
        self.weights: list[dict[str, Tensor]] = []
        self.requires_grad: list[bool] = []
        self.wrapped_model = ""

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.wrapped_model = type(trainer.strategy.model).__name__
        self.weights.append(_weights(pl_module))

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if trainer.global_step < STATS_STEPS:
            self.batches.append(batch.detach().cpu().clone())

    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        self.losses.append(float(outputs["loss"]))
        self.weights.append(_weights(pl_module))
        self.requires_grad.append(all(p.requires_grad for _, p in pl_module.trainable_parameters()))


def _param_classes(module: torch.nn.Module) -> list[str]:
    return sorted({type(p).__name__ for p in module.parameters()})


def main(kind: str, output: Path) -> None:
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

    from radio_lit.data import SyntheticDataModule

    seed_everything(SEED, verbose=False)
    timeout = timedelta(seconds=TIMEOUT_S)
    kind, imported = kind.removesuffix("-imported"), kind.endswith("-imported")
    kind, ema = kind.removesuffix("-ema"), kind.endswith("-ema")
    if kind in ("ddp", "partitions"):
        strategy = DDPStrategy(
            process_group_backend="gloo", broadcast_buffers=False, timeout=timeout
        )
    elif kind in ("fsdp2", "fsdp2-blocks", "fsdp2-lr0", "fsdp2-hidden"):
        strategy = ModelParallelStrategy(
            data_parallel_size=2,
            tensor_parallel_size=1,
            process_group_backend="gloo",
            timeout=timeout,
        )
    else:
        raise SystemExit(f"unknown kind {kind!r}: use ddp, fsdp2[-blocks] or partitions[-ema]")
    if kind == "fsdp2-hidden":  # an output type FSDP2 cannot see (with torch <= 2.13)
        from torch.utils._pytree import _deregister_pytree_node

        from radio_lit.students.base import StudentOutput

        _deregister_pytree_node(StudentOutput)

    if kind == "partitions":
        module = build_partitioned_module()
    elif imported:
        module = build_imported_module(output, mesa=MESA(decay=0.5) if ema else None)
    else:
        layout = FSDP2(layout="blocks") if kind == "fsdp2-blocks" else DEFAULT_FSDP2
        module = build_module(mesa=MESA(decay=0.5) if ema else None, fsdp2=layout)
        if kind == "fsdp2-lr0":
            module.optimizer_factory = partial(torch.optim.AdamW, lr=0.0)
    spectral_batches: list[int] = []
    computed = spectral_reparam.effective_weights

    def counted(layers: list[Any]) -> list[Tensor]:
        spectral_batches.append(len(layers))
        return computed(layers)

    spectral_reparam.effective_weights = counted
    recorder = Recorder()
    guard = TrainingProgressGuard(every_n_steps=1)
    trainer = cpu_trainer(
        output,
        devices=2,
        strategy=strategy,
        max_steps=MAX_STEPS,
        callbacks=[
            TeacherStatsEstimation(steps=STATS_STEPS, refit_every=1),
            FreezeBody(steps=FREEZE_STEPS),
            guard,
            recorder,
        ],
        limit_val_batches=0,
    )
    data = SyntheticDataModule(
        num_samples=NUM_SAMPLES, crop_size=CROP_SIZE, batch_size=BATCH_SIZE, seed=SEED
    )
    trainer.fit(module, datamodule=data)

    rank = trainer.global_rank
    ema_weights = (
        {} if module.ema is None else {n: _full(p) for n, p in module.ema.named_parameters()}
    )
    result = {
        "ema": ema_weights,
        "batches": recorder.batches,
        "spectral_batches": spectral_batches,
        "checked_groups": sorted(guard.checked_groups),
        "losses": recorder.losses,
        "weights": recorder.weights,
        "requires_grad": recorder.requires_grad,
        "normalizers": {
            name: {k: v.detach().cpu().clone() for k, v in n.state_dict().items()}
            for name, n in module.normalizers.items()
        },
        "normalizer_buffer_classes": sorted(
            {type(b).__name__ for b in module.normalizers.buffers()}
        ),
        "placements": {
            "teachers": _param_classes(module.teachers),
            "student": _param_classes(module.student),
            "heads": _param_classes(module.heads),
        },
        "info": {
            "strategy": type(trainer.strategy).__name__,
            "world_size": trainer.world_size,
            "wrapped_model": recorder.wrapped_model,
            "teacher_numel": sum(p.numel() for p in module.teachers.parameters()),
            "finite_losses": all(math.isfinite(x) for x in recorder.losses),
        },
    }
    written = output / f"rank{rank}.pt.partial"
    torch.save(result, written)
    os.replace(written, output / f"rank{rank}.pt")
    trainer.strategy.barrier("results-written")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
    # Run as a script, rank 0 launched rank 1 (Lightning's launcher keeps its Popen objects):
    # leave no orphan.
    for proc in getattr(trainer.strategy.launcher, "procs", []):
        proc.wait(timeout=TIMEOUT_S)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        raise SystemExit(__doc__)
    main(sys.argv[1], Path(sys.argv[2]))
