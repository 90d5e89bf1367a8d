"""Partitions on 2 CPU/gloo ranks (AM-RADIO 4 "Rank/Teacher Partitioning").

``distributed_fit.py partitions`` trains with two partitions, one per rank: CLIP+DINOv2 on
rank 0 (4 images per step), DINOv2+SAM on rank 1 (2 images). Each teacher's statistics must
be those of the images its ranks saw (CLIP: rank 0's, SAM: rank 1's, DINOv2: both), held by
both ranks; and the update must equal a 1-process run whose rank runs both partitions in
turn on the same images.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch import Callback
from torch import Tensor
from torch.utils.data import DataLoader

from radio_lit.callbacks import FreezeBody, TeacherStatsEstimation
from radio_lit.data.views import as_float_images
from tests.builders import cpu_trainer
from tests.distributed import distributed_fit as fit
from tests.distributed.test_distributed_fit import Result, _close, _Launch, _result

pytestmark = pytest.mark.distributed

RANK_IMAGES = {"clip_dino": 4, "dino_sam": 2}  # batch_size / 1 rank each


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> Result:
    return _result(_Launch.start("partitions", tmp_path_factory.mktemp("partitions")))


def _images(ranks: Result) -> dict[str, list[Tensor]]:
    """Per teacher, the crops of every estimation step that its partitions' ranks used."""
    rank0 = [b[: RANK_IMAGES["clip_dino"]] for b in ranks[0]["batches"]]
    rank1 = [b[: RANK_IMAGES["dino_sam"]] for b in ranks[1]["batches"]]
    return {"clip": rank0, "dino": rank0 + rank1, "sam": rank1}


def test_each_rank_loads_only_the_images_its_partition_takes(ranks: Result) -> None:
    """The data batch is 4 per rank; rank 1's partition takes 2, so it loads only 2."""
    for rank, images in enumerate(RANK_IMAGES.values()):
        assert ranks[rank]["batches"], f"rank {rank} recorded no batch"
        assert {len(batch) for batch in ranks[rank]["batches"]} == {images}, f"rank {rank}"


def test_each_teacher_pools_exactly_the_ranks_that_run_it(ranks: Result) -> None:
    reference = fit.build_partitioned_module()
    for name, crops in _images(ranks).items():
        with torch.no_grad():
            out = reference.run_teachers(as_float_images(torch.cat(crops)), (name,))[name]
        y = out.features.double().reshape(-1, out.features.shape[-1])
        centered = y - y.mean(0)
        for rank, result in enumerate(ranks):
            state = result["normalizers"][name]
            assert state["count"].item() == y.shape[0], f"rank {rank} {name}"
            _close(state["mean"], y.mean(0), f"rank {rank} {name}.mean")
            _close(state["m2"], centered.T @ centered, f"rank {rank} {name}.m2")
            assert bool(state["fitted"])
        for key, value in ranks[0]["normalizers"][name].items():
            assert torch.equal(ranks[1]["normalizers"][name][key], value), f"{name}.{key}"


class _Weights(Callback):
    def __init__(self) -> None:
        self.weights: list[dict[str, Tensor]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.weights.append({k: p.detach().clone() for k, p in pl_module.trainable_parameters()})


def test_the_update_equals_one_rank_running_both_partitions(ranks: Result, tmp_path: Path):
    """One process, one batch per step: rank 0's 4 crops then rank 1's 2 crops; its rank runs
    both partitions in turn. The weights after every recorded step match the 2-rank run's
    (the same ``max_steps``, so the same LR schedule)."""
    steps = fit.STATS_STEPS  # the steps whose crops the 2-rank run recorded
    batches = [
        torch.cat([b0[: RANK_IMAGES["clip_dino"]], b1[: RANK_IMAGES["dino_sam"]]])
        for b0, b1 in zip(ranks[0]["batches"], ranks[1]["batches"], strict=True)
    ]
    module = fit.build_partitioned_module()
    recorder = _Weights()
    trainer = cpu_trainer(
        tmp_path,
        max_steps=fit.MAX_STEPS,
        callbacks=[
            TeacherStatsEstimation(steps=fit.STATS_STEPS, refit_every=1),
            FreezeBody(steps=fit.FREEZE_STEPS),
            recorder,
        ],
        limit_val_batches=0,
    )
    trainer.fit(module, DataLoader(batches, batch_size=None))
    initial = ranks[0]["weights"][0]
    for step, single in enumerate(recorder.weights[:steps], start=1):
        unmoved = [
            k for k, v in single.items() if k.startswith("heads.") and torch.equal(v, initial[k])
        ]
        assert not unmoved, f"head parameters that SGD did not move: {unmoved}"
        for key, value in single.items():
            # Float sums in another order (a rank's half batch, then DDP's average) differ in the
            # last bits; a wrong partition weight would be off by a fraction of the whole update.
            update = (value - initial[key]).abs().max().item()
            torch.testing.assert_close(
                ranks[0]["weights"][step][key],
                value,
                rtol=0.0,
                atol=max(1e-3 * update, 1e-6),
                msg=lambda m, k=key, s=step: f"2 ranks vs 1 after {s} steps, {k}: {m}",
            )
