"""The adapt twin (``configs/recipes/adapt/quickstart.yaml``) trained on 1 or 2 CPU processes,
written out per rank for ``tests/distributed/test_adapt_twin_fit.py``.

The twin is built by ``RadioLitCLI`` from its own YAML (:func:`benchmarks.harness.build`: no
validation), started from the stand-in of the file its header makes
(:func:`tests.published_stand_in.radio_stand_in`, given as ``stand_in``): the student
imports its trunk, conditioner and the ``clip``, ``dino`` and ``sam`` heads, the four
``RADIOTeacher`` entries read it. What the test changes, on the command line:

- the strategy: ``one`` (one process, ``auto``), ``ddp`` (``DDPStrategy`` over gloo) or
  ``fsdp2`` (``ModelParallelStrategy``, data parallel 2: the student and heads sharded, the
  imported heads composed with each refit on their shards) on 2 ranks;
- the images per step: ``GLOBAL_BATCH`` in all, so 2 ranks take half each. The twin's sampler
  (``radio_lit.data.resumable.SeededSampler``) gives rank ``r`` of ``n`` the places ``r::n`` of
  one shuffled epoch and each image a crop seeded by its index, so a step of the 2 ranks
  together sees the same images as the one process;
- the CPE windows: the whole grid (``cpe_min_scale: 1``, ``cpe_max_aspect: 1``) [choice], so
  that no random draw differs between a rank and the one process;
- ``MAX_STEPS`` steps: statistics estimated and refitted at steps 0 and 1, the trunk frozen at
  step 0 and trained from step 1 (the config's callbacks, shortened; no logger).

The FSDP2 run saves a checkpoint after ``RESUME_FROM`` steps (``ModelCheckpoint``, a
distributed checkpoint folder); ``fsdp2-resumed`` resumes it (``ckpt_path``) on 2 ranks for
the last step.

Each rank writes ``rank{R}.pt``: its ``losses`` per step and the ``weights`` of the student and
heads (gathered in full) before training and after each step
(:class:`tests.distributed.distributed_fit.Recorder`).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

from tests.distributed.distributed_fit import Recorder
from tests.forking import REPO

CONFIG = "configs/recipes/adapt/quickstart.yaml"
MAX_STEPS = 3
RESUME_FROM = 2  # the FSDP2 runs' checkpoint: after the statistics' estimation
GLOBAL_BATCH = 8
STRATEGIES = {
    "one": "auto",
    "ddp": {
        "class_path": "lightning.pytorch.strategies.DDPStrategy",
        "init_args": {"process_group_backend": "gloo", "broadcast_buffers": False},
    },
    "fsdp2": {
        "class_path": "lightning.pytorch.strategies.ModelParallelStrategy",
        "init_args": {
            "data_parallel_size": 2,
            "tensor_parallel_size": 1,
            "process_group_backend": "gloo",
        },
    },
}
CALLBACKS = [
    {
        "class_path": "radio_lit.callbacks.TeacherStatsEstimation",
        "init_args": {"steps": 2, "refit_every": 1},
    },
    {"class_path": "radio_lit.callbacks.FreezeBody", "init_args": {"steps": 1}},
    {"class_path": "radio_lit.callbacks.NonFiniteGuard"},
]


def overrides(kind: str, stand_in: str, output: Path) -> list[str]:
    """The twin's command line for ``kind`` (see the module docstring)."""
    from radio_lit.planning.random_weights import override

    devices = 1 if kind == "one" else 2
    callbacks = CALLBACKS
    if kind.startswith("fsdp2"):  # a checkpoint after RESUME_FROM steps, to resume from
        callbacks = [*CALLBACKS, {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"dirpath": str(output / "checkpoints"), "filename": "{step}",
                          "every_n_train_steps": RESUME_FROM, "save_top_k": -1},
        }]  # fmt: skip
    out = [f"--model.init_from={stand_in}"]
    for name in ("quickstart", "clip", "dino", "sam"):
        out.append(f"--model.teachers.{name}.init_args.model={stand_in}")
    out += [
        f"--trainer.devices={devices}",
        override("--trainer.strategy", STRATEGIES[kind.removesuffix("-resumed")]),
        override("--trainer.callbacks", callbacks),
        "--trainer.logger=false",
        f"--trainer.enable_checkpointing={kind.startswith('fsdp2')}",
        f"--data.init_args.batch_size={GLOBAL_BATCH // devices}",
        f"--data.init_args.num_samples={GLOBAL_BATCH * MAX_STEPS}",
        "--data.init_args.val_dir=null",
        "--model.student.init_args.cpe_min_scale=1.0",
        "--model.student.init_args.cpe_max_aspect=1.0",
    ]
    return out


def main(kind: str, output: Path, stand_in: str, resume: str | None = None) -> None:
    """Rank ``LOCAL_RANK``'s run of ``kind`` (``one``, ``ddp``, ``fsdp2``, or
    ``fsdp2-resumed``: from the checkpoint ``resume``)."""
    from benchmarks.harness import build

    cli = build(REPO / CONFIG, overrides(kind, stand_in, output), max_steps=MAX_STEPS)
    recorder = Recorder()
    cli.trainer.callbacks.append(recorder)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule, ckpt_path=resume)
    rank = cli.trainer.global_rank
    result = {
        "losses": recorder.losses,
        "weights": recorder.weights,
        "strategy": type(cli.trainer.strategy).__name__,
        "world_size": cli.trainer.world_size,
        "placements": sorted({type(p).__name__ for p in cli.model.heads.parameters()}),
    }
    written = output / f"rank{rank}.pt.partial"
    torch.save(result, written)
    os.replace(written, output / f"rank{rank}.pt")
    cli.trainer.strategy.barrier("results-written")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5):
        raise SystemExit(__doc__)
    main(sys.argv[1], Path(sys.argv[2]), *sys.argv[3:])
