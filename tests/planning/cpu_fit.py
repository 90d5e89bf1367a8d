"""Real Lightning fits of ``test_cpu_fit.py`` (``RUNS``) on one process or several (gloo),
each rank's peak bytes and step CPU time, one JSON line per rank:

    OMP_NUM_THREADS=1 python -m tests.planning.cpu_fit ddp
    OMP_NUM_THREADS=1 python -m torch.distributed.run --nproc-per-node 2 \
        -m tests.planning.cpu_fit ddp --devices 2

One fit in a fresh process (a fit's allocator state would change the next one's): its first
steps under ``torch.profiler`` for the peak, its last ones timed without it. Run at the thread count
of the calibration it is compared with (``OMP_NUM_THREADS``, set before torch starts: a
thread pool of two made at import and cut to one later keeps a spinning OpenMP worker whose
CPU time counts in the process's).
"""

from __future__ import annotations

import gc
import json
import os
import statistics
import sys
import time
from typing import Any

import torch
from lightning.pytorch import Callback, Trainer
from torch.profiler import ProfilerActivity, profile, record_function

from benchmarks import gpu_check
from tests.planning.test_cpu_step import _profiled_peak

#: (config, strategy, larger CPU sizes: the activations outweigh the weights).
RUNS = {
    "ddp": (
        "recipes/am-radio/stage2.yaml",
        "DDP",
        [
            "--model.init_from=null",
            '--model.student.init_args.model_kwargs={"embed_dim": 128, "depth": 2, "num_heads": 2}',
            "--model.partitions.clip_dino.batch_size=4",
            "--model.partitions.clip_dino.resolutions=[96]",
            "--model.partitions.sam.batch_size=2",
            "--model.partitions.sam.resolutions=[128]",
            "--data.init_args.batch_size=6",
        ],
    ),
    "fsdp2": (
        "stage1.yaml",
        "FSDP2",
        [
            '--model.student.init_args.model_kwargs={"embed_dim": 128, "depth": 4, "num_heads": 4}',
            "--data.init_args.batch_size=8",
            "--data.init_args.crop_size=128",
        ],
    ),
}


def _config(name: str) -> gpu_check.ShippedConfig:
    return next(c for c in gpu_check.shipped_configs() if c.name == name)


class _Kept(Callback):
    """The bytes of the module's tensors in its step 1 that were made before the fit (FSDP2's
    shards of the student and heads are new; the teachers and buffers are not)."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.before = {t.untyped_storage().data_ptr() for t in _tensors(module)}
        self.kept = 0

    def on_train_batch_start(
        self, trainer: Trainer, pl_module: torch.nn.Module, *_: object
    ) -> None:
        if trainer.global_step == 1:
            storages = {
                t.untyped_storage().data_ptr(): t.untyped_storage() for t in _tensors(pl_module)
            }
            self.kept = sum(s.nbytes() for ptr, s in storages.items() if ptr in self.before)


def _tensors(module: torch.nn.Module) -> list[torch.Tensor]:
    tensors = [*module.parameters(), *module.buffers()]
    return [getattr(t, "_local_tensor", t) for t in tensors]  # a DTensor's shard


def devices_overrides(name: str, devices: int) -> list[str]:
    """The overrides that run ``RUNS[name]`` on ``devices`` processes (FSDP2: its data
    parallel size)."""
    out = [f"--trainer.devices={devices}"]
    if RUNS[name][1] == "FSDP2":
        out.append(f"--trainer.strategy.init_args.data_parallel_size={devices}")
    return out


class _Profiled(Callback):
    """``torch.profiler`` with memory from before the fit to the end of step ``steps - 1``,
    each step in an event named ``step N``."""

    def __init__(self, steps: int) -> None:
        self.steps = steps
        self.profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._step: Any = None

    def on_train_batch_start(self, trainer: Trainer, *_: object) -> None:
        if trainer.global_step < self.steps:
            self._step = record_function(f"step {trainer.global_step}")
            self._step.__enter__()

    def on_train_batch_end(self, trainer: Trainer, *_: object) -> None:
        if self._step is not None:
            self._step.__exit__(None, None, None)
            self._step = None
        if trainer.global_step == self.steps:
            self.profile.__exit__(None, None, None)


class _StepTime(Callback):
    """Each training step's CPU time of this process (forward, backward, optimizer step; the
    data loading outside) after step ``after`` (warm-up: lazy state, allocator, profiler)."""

    def __init__(self, after: int) -> None:
        self.after = after
        self.steps: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, *_: object) -> None:
        self._start = time.process_time()

    def on_train_batch_end(self, trainer: Trainer, *_: object) -> None:
        if trainer.global_step > self.after:
            self.steps.append(time.process_time() - self._start)


#: Steps profiled for the peak, taken from step 1 on (it holds the earlier step's gradients and
#: the optimizer state; step 0 makes the optimizer state and runs the progress guard's first
#: check, whose copies of the weights the plan of ``--step 1`` does not hold), then steps
#: timed after one more warm-up.
PROFILED, TIMED = 3, 5


def measured(config: gpu_check.ShippedConfig, extra: list[str]) -> tuple[int, float]:
    """One fit's peak bytes (:class:`_Kept` plus the profiled peak) in its first
    :data:`PROFILED` steps and the median CPU seconds of its last :data:`TIMED` steps."""
    steps = PROFILED + 1 + TIMED
    cli = gpu_check.build(
        config, device="cpu", size="cpu", extra=[f"--trainer.max_steps={steps}", *extra]
    )
    kept, profiled, timer = _Kept(cli.model), _Profiled(PROFILED), _StepTime(PROFILED + 1)
    cli.trainer.callbacks += [kept, profiled, timer]
    gc.collect()
    profiled.profile.__enter__()
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    peak = _profiled_peak(profiled.profile, since="step 1")  # the plan's --step 1
    return kept.kept + peak, statistics.median(timer.steps)


if __name__ == "__main__":
    kind = sys.argv[1]
    devices = int(sys.argv[sys.argv.index("--devices") + 1]) if "--devices" in sys.argv else 1
    name, _, overrides = RUNS[kind]
    overrides = [*overrides, *devices_overrides(kind, devices)]
    torch.manual_seed(0)
    peak, step = measured(_config(name), overrides)
    rank = int(os.environ.get("RANK", "0"))
    print(json.dumps({"rank": rank, "peak": peak, "step_s": step}), flush=True)
