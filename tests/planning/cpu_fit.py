"""One real Lightning fit of ``test_cpu_fit.py`` (``RUNS``), measured in a process of its
own (a fit's process group and allocator state would change the next one's):

    python -m tests.planning.cpu_fit ddp          # prints the peak bytes
    python -m tests.planning.cpu_fit ddp --time   # one thread: a step's CPU seconds (median)
"""

from __future__ import annotations

import gc
import statistics
import sys
import time

import torch
from lightning.pytorch import Callback, Trainer
from torch.profiler import ProfilerActivity, profile

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


def _measured(config: gpu_check.ShippedConfig, extra: list[str]) -> int:
    cli = gpu_check.build(config, device="cpu", size="cpu", extra=["--trainer.max_steps=3", *extra])
    kept = _Kept(cli.model)
    cli.trainer.callbacks.append(kept)
    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return kept.kept + _profiled_peak(prof)


class _StepTime(Callback):
    """Each training step's CPU time of this process (forward, backward, optimizer step; the
    data loading outside), the steps after the first two (warm-up: lazy state, allocator)."""

    def __init__(self) -> None:
        self.steps: list[float] = []
        self._start = 0.0

    def on_train_batch_start(self, *_: object) -> None:
        self._start = time.process_time()

    def on_train_batch_end(self, trainer: Trainer, *_: object) -> None:
        if trainer.global_step > 2:
            self.steps.append(time.process_time() - self._start)


def _timed(config: gpu_check.ShippedConfig, extra: list[str], steps: int = 8) -> float:
    """The median CPU seconds of a step of ``steps`` on one thread."""
    torch.set_num_threads(1)
    cli = gpu_check.build(
        config, device="cpu", size="cpu", extra=[f"--trainer.max_steps={steps}", *extra]
    )
    timer = _StepTime()
    cli.trainer.callbacks.append(timer)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    return statistics.median(timer.steps)


if __name__ == "__main__":
    name, _, overrides = RUNS[sys.argv[1]]
    torch.manual_seed(0)
    if "--time" in sys.argv:
        print(_timed(_config(name), overrides))
    else:
        print(_measured(_config(name), overrides))
