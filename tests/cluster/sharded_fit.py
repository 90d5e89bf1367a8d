"""A worker for tests/cluster/test_sharded.py: FSDP2 (``ModelParallelStrategy``) training of
the tiny module of tests/distributed with sharded checkpoints
(``save_distributed_checkpoint=True``).

``main(out, devices, steps, ckpt_path, sharded)``: train to ``steps`` on ``devices`` gloo ranks
(resuming ``ckpt_path`` if given), a sharded (``sharded=False``: consolidated) checkpoint after
every step in ``out/checkpoints`` (all
kept, ``epoch=0-step=<N>.ckpt``, and ``last.ckpt``); rank 0
writes ``out/state.pt``: the full model state (teachers excepted) and the full optimizer
state, gathered from the shards, as the run ends.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import torch
from lightning.pytorch import seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

from radio_lit.callbacks import FreezeBody, NonFiniteGuard, RandomStates, TeacherStatsEstimation
from radio_lit.data import SyntheticDataModule
from radio_lit.distributed.strategies import ModelParallelStrategy
from tests.builders import cpu_trainer
from tests.distributed.distributed_fit import build_module

FROZEN = 2


def _full(t):
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().cpu().clone()


def main(
    out: str, devices: int, steps: int, ckpt_path: str | None = None, sharded: bool = True
) -> None:
    out_dir = Path(out)
    seed_everything(0, verbose=False)
    strategy = ModelParallelStrategy(
        data_parallel_size=devices,
        tensor_parallel_size=1,
        process_group_backend="gloo",
        timeout=timedelta(seconds=60),
        save_distributed_checkpoint=sharded,
    )
    module = build_module()
    checkpoints = ModelCheckpoint(
        dirpath=str(out_dir / "checkpoints"), save_last=True, save_top_k=-1, every_n_train_steps=1
    )
    statistics = TeacherStatsEstimation(steps=2, refit_every=1)
    # as the stages; the trunk's first update at step 2: the checkpoints of steps 1 and 2 hold
    # optimizer state for the heads only
    freeze = FreezeBody(steps=FROZEN)
    callbacks = [statistics, freeze, NonFiniteGuard(), RandomStates(), checkpoints]
    trainer = cpu_trainer(
        out_dir,
        devices=devices,
        strategy=strategy,
        max_steps=steps,
        callbacks=callbacks,
        limit_val_batches=0,
        enable_checkpointing=True,
    )
    data = SyntheticDataModule(num_samples=32, crop_size=64, batch_size=4, seed=0)
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    model = {k: _full(v) for k, v in module.state_dict().items() if not k.startswith("teachers.")}
    (optimizer,) = trainer.optimizers
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)  # on rank 0 only
    moments = get_optimizer_state_dict(module, optimizer, options=options).get("state", {})
    if trainer.global_rank == 0:
        torch.save({"model": model, "optimizer": moments, "step": trainer.global_step},
                   out_dir / "state.pt")  # fmt: skip
    torch.distributed.destroy_process_group()
