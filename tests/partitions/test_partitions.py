"""Partitions (AM-RADIO 4, PHI-S 3) and multi-resolution students (RADIOv2.5 4.2)."""

from __future__ import annotations

import pytest
import torch

from radio_lit.core.errors import ConfigError
from radio_lit.training.partitions import Partition, PartitionPlan, assign_ranks
from tests.builders import tiny_module
from tests.teachers.tiny import tiny_clip_teacher, tiny_dinov2_teacher, tiny_sam_teacher

TEACHERS = ["clip", "dino", "sam"]


@pytest.mark.parametrize(
    ("shares", "world", "expected"),
    [
        ([1, 1], 2, [[0], [1]]),
        ([1, 1], 4, [[0, 1], [2, 3]]),
        ([3, 1], 4, [[0, 1, 2], [3]]),
        ([1, 1, 1, 1], 4, [[0], [1], [2], [3]]),
        ([1, 1, 1, 1], 2, [[0], [1], [0], [1]]),  # fewer ranks: partitions in turn
        ([1, 1, 1], 1, [[0], [0], [0]]),
        ([1, 1], 64, [list(range(32)), list(range(32, 64))]),  # AM-RADIO: half and half
    ],
)
def test_ranks_follow_the_shares(shares, world, expected):
    assert assign_ranks(shares, world) == expected


def phi_s_plan(world: int, rank: int) -> PartitionPlan:
    """PHI-S 3: every teacher its own partition of 256 images (batch 1024)."""
    parts = {t: Partition(teachers=[t], batch_size=256) for t in ["clip", "siglip", "dino", "sam"]}
    plan = PartitionPlan(parts, ["clip", "siglip", "dino", "sam"], (256, 256), 16)
    plan.place(world, rank)
    return plan


@pytest.mark.parametrize("world", [1, 2, 4])
def test_every_world_size_gives_the_same_update_weights(world):
    """After DDP's gradient average (1/W), each partition's mean loss weighs s_p = 1/4 and
    every image is used once, on every world size."""
    crop = torch.zeros(1024 // min(world, 4), 3, 8, 8)
    total: dict[str, float] = {}
    images: dict[str, int] = {}
    for rank in range(world):
        for chunk in phi_s_plan(world, rank).chunks(crop, train=True):
            total[chunk.partition] = total.get(chunk.partition, 0.0) + chunk.weight / world
            images[chunk.partition] = images.get(chunk.partition, 0) + len(chunk.crop)
    assert total == pytest.approx({t: 0.25 for t in ["clip", "siglip", "dino", "sam"]})
    assert images == {t: 256 for t in total}


def test_a_rank_running_several_partitions_gives_each_its_own_images():
    plan = phi_s_plan(world=2, rank=1)  # runs siglip and sam
    crop = torch.arange(512.0).reshape(512, 1, 1, 1).expand(512, 3, 1, 1)
    chunks = plan.chunks(crop, train=True)
    assert [c.partition for c in chunks] == ["siglip", "sam"]
    assert chunks[0].crop[:, 0, 0, 0].tolist() == list(range(256))
    assert chunks[1].crop[:, 0, 0, 0].tolist() == list(range(256, 512))
    assert plan.idle_teachers() == ["clip", "dino"]
    with pytest.raises(ValueError, match="data.init_args.batch_size to at least 512"):
        plan.chunks(crop[:300], train=True)


def test_each_teacher_pools_statistics_over_the_ranks_that_run_it():
    parts = {
        "low": Partition(teachers=["clip", "dino"], batch_size=64),
        "high": Partition(teachers=["dino", "sam"], batch_size=8),
    }
    plan = PartitionPlan(parts, TEACHERS, (64, 64), 16)
    plan.place(4, 0)
    assert plan.placement.teacher_ranks == {"clip": [0, 1], "dino": [0, 1, 2, 3], "sam": [2, 3]}
    assert plan.rank_batch_size(0) == 32 and plan.rank_batch_size(3) == 4
    assert not plan.single


def test_bad_partitions_name_the_key():
    with pytest.raises(ValueError, match=r"model.partitions.a.teachers"):
        PartitionPlan({"a": Partition(teachers=["siglip"])}, TEACHERS, (64, 64), 16)
    with pytest.raises(ValueError, match="in no partition"):
        PartitionPlan({"a": Partition(teachers=["clip"])}, TEACHERS, (64, 64), 16)
    with pytest.raises(ValueError, match=r"model.partitions.b.batch_size is required"):
        PartitionPlan(
            {"a": Partition(teachers=["clip", "dino"], batch_size=4), "b": Partition(["sam"])},
            TEACHERS,
            (64, 64),
            16,
        )
    with pytest.raises(ValueError, match=r"resolutions=\[40\]"):
        PartitionPlan({"a": Partition(resolutions=[40])}, TEACHERS, (64, 64), 16)
    plan = PartitionPlan({"a": Partition(batch_size=6)}, TEACHERS, (64, 64), 16)
    with pytest.raises(ValueError, match="batch_size=6 does not split over its 4 of 4 ranks"):
        plan.place(4, 0)


def test_multi_resolution_steps_at_each_resolution():
    """One resolution per step, drawn from torch's global RNG; DINOv2 and SAM follow the
    student (views of grid x patch pixels), CLIP keeps its native 56 px; training works at
    each resolution."""
    module = tiny_module(
        teachers={
            "clip": tiny_clip_teacher(),
            "dino": tiny_dinov2_teacher(follow_student=True),
            "sam": tiny_sam_teacher(follow_student=True, mosaic=True),
        },
        partitions={"all": Partition(resolutions=[32, 64])},
    )
    views: dict[str, list[int]] = {name: [] for name in ["student", *TEACHERS]}
    for name, part in [("student", module.student), *module.teachers.items()]:
        inner = part.model if name == "sam" else part  # SAM: the encoder sees the mosaics
        inner.register_forward_pre_hook(lambda _, a, n=name: views[n].append(a[0].shape[-1]))
    crop = torch.rand(4, 3, 96, 96)
    seen = {}
    torch.manual_seed(0)
    while len(seen) < 2:
        for v in views.values():
            v.clear()
        loss = module._shared_step(crop, "train")
        loss.backward()
        seen[views["student"][0]] = {n: v[0] for n, v in views.items()}
    assert seen == {
        32: {"student": 32, "clip": 56, "dino": 28, "sam": 128},  # 4x4 SAM mosaic
        64: {"student": 64, "clip": 56, "dino": 56, "sam": 128},  # 2x2 SAM mosaic
    }
    grads = [p.grad for p in module.student.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)


def test_strategies_that_would_break_partitions_are_refused():
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

    parts = {"a": Partition(["clip", "dino"], 4), "b": Partition(["sam"], 2)}
    plan = PartitionPlan(parts, TEACHERS, (64, 64), 16)
    plan.place(2, 0)
    with pytest.raises(ValueError, match="broadcast_buffers: false"):
        plan.check_strategy(DDPStrategy())
    plan.check_strategy(DDPStrategy(broadcast_buffers=False))
    with pytest.raises(ValueError, match="ModelParallelStrategy"):
        plan.check_strategy(ModelParallelStrategy())
    same = PartitionPlan(
        {"low": Partition(batch_size=4), "high": Partition(batch_size=2)}, TEACHERS, (64, 64), 16
    )
    same.place(2, 0)
    same.check_strategy(ModelParallelStrategy())  # stage 3's shape: every rank, same calls


def test_ranks_that_do_not_fit_the_partitions_are_a_config_error():
    """Found at ``setup`` (the rank count is known only then, e.g. under torchrun): a
    :class:`~radio_lit.core.errors.ConfigError`, which ``radio-lit`` prints as one line, exit 2."""
    from types import SimpleNamespace

    from lightning.pytorch.strategies import DDPStrategy

    module = tiny_module(
        partitions={"a": Partition(["clip", "dino"], 5), "b": Partition(["sam"], 2)}
    )
    module._trainer = SimpleNamespace(world_size=4, global_rank=0, strategy=DDPStrategy())
    with pytest.raises(ConfigError, match="batch_size=5 does not split over its 2 of 4 ranks"):
        module.setup("fit")
    module._trainer = SimpleNamespace(world_size=2, global_rank=0, strategy=DDPStrategy())
    with pytest.raises(ConfigError, match="broadcast_buffers: false"):
        module.setup("fit")


def test_resolution_probabilities_and_evaluation_resolution():
    """C-RADIOv4 report 2.2: per-step draws within a partition with configurable chances;
    validation at the partition's stated resolution, not silently its first one."""
    low = Partition(resolutions=[32, 48, 64], probabilities=[0.0, 0.25, 0.75], eval_resolution=48)
    plan = PartitionPlan({"low": low}, TEACHERS, (64, 64), 16)
    torch.manual_seed(0)
    crop = torch.rand(2, 3, 64, 64)
    drawn = [plan.chunks(crop, train=True)[0].resolution[0] for _ in range(2000)]
    assert 32 not in drawn and drawn.count(64) / len(drawn) == pytest.approx(0.75, abs=0.03)
    assert plan.chunks(crop, train=False)[0].resolution == (48, 48)
    with pytest.raises(ValueError, match="model.partitions.low.probabilities"):
        PartitionPlan(
            {"low": Partition(resolutions=[32], probabilities=[0.5, 0.5])}, TEACHERS, (64, 64), 16
        )
    with pytest.raises(ValueError, match="model.partitions.low.eval_resolution=40"):
        PartitionPlan({"low": Partition(eval_resolution=40)}, TEACHERS, (64, 64), 16)


@pytest.mark.parametrize(("rank", "uses"), [(0, 4), (1, 2)])
def test_each_rank_decodes_only_the_images_its_partitions_use(rank, uses, monkeypatch):
    """C-RADIOv4's layout in small: ``low`` (4 images) on rank 0, ``high`` (2) on rank 1, a
    data batch of 6 per rank. At setup the model tells the datamodule its rows; each rank's
    loader then decodes (``__getitem__``) only the images its partition takes, the first rows
    of the whole batch, as many batches."""
    from types import SimpleNamespace

    from lightning.pytorch.strategies import DDPStrategy

    from radio_lit.data import SyntheticDataModule, SyntheticImages

    decoded, read = [], SyntheticImages.__getitem__

    def counted(images: SyntheticImages, index: int) -> torch.Tensor:
        decoded.append(index)
        return read(images, index)

    monkeypatch.setattr(SyntheticImages, "__getitem__", counted)
    parts = {"low": Partition(batch_size=4), "high": Partition(batch_size=2)}
    module = tiny_module(partitions=parts)
    whole = SyntheticDataModule(num_samples=48, crop_size=64, batch_size=6)
    trainer = SimpleNamespace(world_size=2, global_rank=rank, strategy=DDPStrategy())
    whole.trainer = trainer
    whole.setup("fit")
    expected = list(whole.train_dataloader())
    data = SyntheticDataModule(num_samples=48, crop_size=64, batch_size=6)
    data.trainer = trainer
    module._trainer = SimpleNamespace(**vars(trainer), datamodule=data)
    data.setup("fit")  # Lightning: the datamodule's setup, then the model's
    module.setup("fit")
    decoded.clear()
    batches = []
    for batch in data.train_dataloader():
        batches.append(batch)
        assert len(decoded) == uses * len(batches)  # decoded per step: what the step uses
    assert len(batches) == len(expected) == 4
    for batch, full in zip(batches, expected, strict=True):
        assert torch.equal(batch, full[:uses])
        (chunk,) = module.partitions.chunks(batch, train=True)
        assert chunk.crop.shape[0] == uses
    small = SyntheticDataModule(num_samples=48, crop_size=64, batch_size=uses - 1)
    module._trainer = SimpleNamespace(**vars(trainer), datamodule=small)
    with pytest.raises(ConfigError, match=f"set data.init_args.batch_size to at least {uses}"):
        module.setup("fit")
