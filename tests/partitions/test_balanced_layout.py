"""The balanced layout (``every_rank: true``, radio_lit.training.partitions): every rank takes
its share of each partition every step, the update and each partition's resolution
distribution unchanged (C-RADIOv4 report 2.2's two partitions at 64 GPUs: 16 low-res and 2
high-res images a rank)."""

from __future__ import annotations

import pytest
import torch

from radio_lit.training.partitions import Partition, PartitionPlan

TEACHERS = ["siglip", "dino"]
LOW = [128, 192, 224, 256, 384, 432]  # C-RADIOv4 stage 1's partitions [C4 2.2]
HIGH = [512, 768, 1024, 1152]


def c_radio(every_rank: bool, high_chances: list[float] | None = None) -> PartitionPlan:
    """Stage 1's two partitions of every teacher: 1,024 low-res and 128 high-res images."""
    parts = {
        "low_res": Partition(batch_size=1024, resolutions=LOW, every_rank=every_rank),
        "high_res": Partition(
            batch_size=128, resolutions=HIGH, probabilities=high_chances, every_rank=every_rank
        ),
    }
    return PartitionPlan(parts, TEACHERS, (432, 432), 16)


def test_every_rank_takes_its_share_of_each_partition():
    plan = c_radio(every_rank=True)
    plan.place(64, 5)
    assert plan.placement.ranks == {"low_res": list(range(64)), "high_res": list(range(64))}
    assert plan.rank_batch_size() == 16 + 2 and plan.single
    crop = torch.arange(18.0).reshape(18, 1, 1, 1)
    chunks = plan.chunks(crop, train=True)
    assert [(c.partition, len(c.crop)) for c in chunks] == [("low_res", 16), ("high_res", 2)]
    assert chunks[1].crop.flatten().tolist() == [16.0, 17.0]  # disjoint rows
    blocks = c_radio(every_rank=False)
    blocks.place(64, 5)  # the report's layout: 32 ranks of 32 low-res images
    assert blocks.rank_batch_size() == 32 and blocks.placement.ranks["low_res"] == list(range(32))


@pytest.mark.parametrize("world", [1, 2, 64])
def test_the_update_weights_equal_the_block_layouts(world):
    """After the gradient average (1/W), each partition's mean loss weighs ``s_p`` (here 1/2)
    and every image of its global batch is used once, in both layouts."""

    def weights(every_rank: bool) -> tuple[dict[str, float], dict[str, int]]:
        total: dict[str, float] = {}
        images: dict[str, int] = {}
        for rank in range(world):
            plan = c_radio(every_rank)
            plan.place(world, rank)
            crop = torch.zeros(plan.rank_batch_size(), 1, 1, 1)
            for chunk in plan.chunks(crop, train=True):
                share = chunk.weight / world
                total[chunk.partition] = total.get(chunk.partition, 0.0) + share
                images[chunk.partition] = images.get(chunk.partition, 0) + len(chunk.crop)
        return total, images

    balanced, blocks = weights(True), weights(False)
    assert balanced[0] == pytest.approx({"low_res": 0.5, "high_res": 0.5})
    assert blocks[0] == pytest.approx(balanced[0])
    assert balanced[1] == blocks[1] == {"low_res": 1024, "high_res": 128}


def test_the_draws_keep_each_partitions_marginal_distribution():
    """10,000 steps of one rank: each partition's resolutions at their chances (within 4.5
    standard errors), and the two partitions' draws independent (no coupling: the pair counts
    match the product of the marginals), as every rank draws them alike."""
    high_chances = [0.1, 0.2, 0.3, 0.4]
    plan = c_radio(every_rank=True, high_chances=high_chances)
    plan.place(64, 3)
    crop = torch.zeros(18, 1, 1, 1)
    torch.manual_seed(0)
    steps = 10_000
    pairs = torch.zeros(len(LOW), len(HIGH))
    for _ in range(steps):
        low, high = plan.chunks(crop, train=True)
        pairs[LOW.index(low.resolution[0]), HIGH.index(high.resolution[0])] += 1
    uniform = [1 / len(LOW)] * len(LOW)
    for counts, chances in [(pairs.sum(1), uniform), (pairs.sum(0), high_chances)]:
        expected = torch.tensor(chances) * steps
        error = (expected * (1 - torch.tensor(chances))).sqrt()
        assert ((counts - expected).abs() < 4.5 * error).all(), (counts, expected)
    independent = torch.outer(pairs.sum(1), pairs.sum(0)) / steps
    chi2 = ((pairs - independent) ** 2 / independent).sum().item()
    assert chi2 < 45.0  # 15 degrees of freedom: p < 1e-4 beyond it
    other = c_radio(every_rank=True, high_chances=high_chances)
    other.place(64, 40)
    torch.manual_seed(1)
    first = [c.resolution for c in plan.chunks(crop, train=True)]
    torch.manual_seed(1)
    assert [c.resolution for c in other.chunks(crop, train=True)] == first  # ranks alike


def test_a_batch_that_does_not_divide_names_the_nearest_that_does():
    plan = c_radio(every_rank=True)
    with pytest.raises(ValueError) as error:
        plan.place(48, 0)  # 1,024 low-res images over 48 ranks: 21.3 each
    message = str(error.value)
    assert "model.partitions.low_res.batch_size=1024 does not split over its 48 of 48" in message
    assert "the nearest that does is 1008" in message and "\n" not in message


def test_every_rank_partitions_beside_blocks():
    """A partition on every rank beside two on blocks (here SAM's on its own ranks)."""
    parts = {
        "low": Partition(teachers=["siglip", "dino"], batch_size=8, every_rank=True),
        "a": Partition(teachers=["siglip"], batch_size=2),
        "b": Partition(teachers=["dino"], batch_size=2),
    }
    plan = PartitionPlan(parts, TEACHERS, (64, 64), 16)
    plan.place(4, 3)
    assert plan.placement.ranks == {"low": [0, 1, 2, 3], "a": [0, 1], "b": [2, 3]}
    assert plan.rank_batch_size() == 2 + 1
    assert [c.weight for c in plan.chunks(torch.zeros(3, 1, 1, 1), train=True)] == [
        pytest.approx(1 / 3),
        pytest.approx(2 / 3),
    ]


def test_a_mosaic_cache_of_one_layout_is_refused_by_the_other():
    """A mosaic teacher's canvases hold a rank's rows of its partition, which the layout
    changes: the cache records it (older caches, without the key, read as blocks)."""
    from radio_lit.cache.grouping import grouping_problem, partitions_record

    blocks, spread = partitions_record(c_radio(False)), partitions_record(c_radio(True))
    assert "every_rank" not in blocks["low_res"] and spread["low_res"]["every_rank"] is True
    recorded = {"ranks": [64], "batch_size": 18, "partitions": blocks}
    assert grouping_problem(recorded, ["sam"], 64, 18, blocks) is None
    problem = grouping_problem(recorded, ["sam"], 64, 18, spread)
    assert problem is not None and "other model.partitions than the cache's" in problem
