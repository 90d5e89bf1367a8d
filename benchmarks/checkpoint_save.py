"""Checkpoint save time and peak memory: one consolidated ``.ckpt`` against sharded shards.

A timm ViT student (default ``vit_large_patch16_224``, 304 M parameters) with timm's LAMB,
sharded over the ranks by FSDP2 (``ModelParallelStrategy``, as the stage configs), takes one
training step, then ``Trainer.save_checkpoint`` writes its checkpoint twice: sharded
(``save_distributed_checkpoint=True``: every rank writes its own shards), then consolidated
(``False``: the whole model and optimizer state gathered onto rank 0, one file). Sharded goes
first: memory a save frees stays in the process, so a save after a larger one would show no
rise. Each save is timed (wall
clock, all ranks) and each rank's resident memory is sampled every 5 ms during the save; the
figures are the slowest rank's time and the largest rise of a rank's resident memory over its
level before the save, and the size on disk.

    torchrun --standalone --nproc_per_node 2 benchmarks/checkpoint_save.py  # CPU, gloo
    torchrun --standalone --nproc_per_node 2 benchmarks/checkpoint_save.py \
        --model vit_base_patch16_224

The last line it prints is ``ratio (sharded / consolidated): time X.XX, peak memory X.XX``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import timm
import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from timm.optim import Lamb
from torch.distributed.fsdp import fully_shard

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402


def _rss() -> int:
    """This process's resident memory in bytes."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class _PeakRss:
    """The largest resident memory seen while the ``with`` block runs (sampled every 5 ms)."""

    def __enter__(self) -> _PeakRss:
        self.start = self.peak = _rss()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(0.005):
            self.peak = max(self.peak, _rss())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, _rss())


class Student(pl.LightningModule):
    """A timm ViT regressing random targets; FSDP2 shards each block and the root."""

    def __init__(self, model: str) -> None:
        super().__init__()
        self.vit = timm.create_model(model, num_classes=0)

    def configure_model(self) -> None:
        mesh = self.device_mesh["data_parallel"]
        for block in self.vit.blocks:
            fully_shard(block, mesh=mesh)
        fully_shard(self.vit, mesh=mesh)

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        return self.vit(batch).square().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return Lamb(self.parameters(), lr=1e-3, weight_decay=0.02)


def _measure(model: str, distributed: bool, folder: Path) -> tuple[float, int, int]:
    """(seconds, peak memory rise in bytes, bytes on disk) of this rank's save."""
    strategy = ModelParallelStrategy(
        data_parallel_size=int(os.environ.get("WORLD_SIZE", "1")),
        tensor_parallel_size=1,
        save_distributed_checkpoint=distributed,
        timeout=timedelta(minutes=10),
    )
    trainer = harness.trainer(
        accelerator="cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        strategy=strategy,
        max_steps=1,
    )
    images = torch.randn(2, 3, 224, 224)
    trainer.fit(Student(model), torch.utils.data.DataLoader([images[0], images[1]], batch_size=1))
    path = folder / ("sharded.ckpt" if distributed else "consolidated.ckpt")
    trainer.strategy.barrier()
    with _PeakRss() as memory:
        start = time.perf_counter()
        trainer.save_checkpoint(path)
        seconds = time.perf_counter() - start
    if path.is_dir():
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    else:
        size = path.stat().st_size if path.exists() else 0
    return seconds, memory.peak - memory.start, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="vit_large_patch16_224", help="a timm ViT")
    args = parser.parse_args()
    torch.manual_seed(0)
    # the same folder on every rank (torchrun gives them one MASTER_PORT)
    folder = Path(tempfile.gettempdir(), f"radio-lit-ckpt-{os.environ.get('MASTER_PORT', 0)}")
    folder.mkdir(exist_ok=True)
    results = {}
    for distributed in (True, False):
        seconds, rise, size = _measure(args.model, distributed, folder)
        gathered = [(seconds, rise, size)]
        if torch.distributed.is_initialized():
            gathered = [None] * torch.distributed.get_world_size()
            torch.distributed.all_gather_object(gathered, (seconds, rise, size))
        results[distributed] = (
            max(g[0] for g in gathered),
            max(g[1] for g in gathered),
            max(g[2] for g in gathered),
        )
        if int(os.environ.get("RANK", "0")) == 0:  # as it goes: a later save may not fit
            print(
                f"{'sharded' if distributed else 'consolidated'}: {results[distributed]}",
                flush=True,
            )
    if int(os.environ.get("RANK", "0")) == 0:
        world = os.environ.get("WORLD_SIZE", "1")
        print(f"{args.model}, LAMB, {world} CPU rank(s), FSDP2 (ModelParallelStrategy)")
        for distributed, (seconds, rise, size) in results.items():
            kind = "sharded     " if distributed else "consolidated"
            print(
                f"{kind}: save {seconds:6.2f} s, peak memory rise {rise / 2**30:5.2f} GiB "
                f"(largest rank), {size / 2**30:5.2f} GiB on disk"
            )
        (t0, m0, _), (t1, m1, _) = results[False], results[True]
        print(f"ratio (sharded / consolidated): time {t1 / t0:.2f}, peak memory {m1 / m0:.2f}")
        shutil.rmtree(folder, ignore_errors=True)
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
