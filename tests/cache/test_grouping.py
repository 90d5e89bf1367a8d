"""A mosaic teacher's cached outputs are the live step's, at every rank count cached.

SAM with ``mosaic`` packs the views of its partition's rows 2 x 2 per canvas, and its global
attention mixes them, so an image's features depend on its canvas neighbours, which depend
on the rank count, the batch and the partitions (:mod:`radio_lit.cache.grouping`). With two
partitions (CLIP on 2 rows, the mosaic SAM on 4), the cache written for 1 and 2 ranks must
hold, bit for bit, what each rank's live step computes; a replay at a rank count the cache
was not written for is refused with one line.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from radio_lit.cache import CachedViews
from radio_lit.cache.writer import write_cache
from radio_lit.core.errors import ConfigError
from radio_lit.data import SAMPLE_IMAGES, ImageFolderDataModule
from radio_lit.data.views import as_float_images
from radio_lit.training.partitions import Partition
from radio_lit.training.teachers import run_teachers
from tests.builders import tiny_module
from tests.teachers.tiny import tiny_clip_teacher, tiny_sam_teacher

BATCH = 6  # per rank: CLIP's 2 rows, then the mosaic SAM's 4 (one 2 x 2 canvas)


def _module(mosaic: bool = True, every_rank: bool = False) -> Any:
    """``every_rank``: the balanced layout (every rank runs both partitions: at 2 ranks CLIP
    on 1 row, the mosaic SAM on 4, one canvas)."""
    torch.manual_seed(0)
    teachers = {
        "clip": tiny_clip_teacher(),
        "sam": tiny_sam_teacher(resolution=64, mosaic=mosaic),  # 128 px canvas: 2 x 2 views
    }
    layout = {
        "semantic": Partition(teachers=["clip"], batch_size=2, every_rank=every_rank),
        "sam": Partition(
            teachers=["sam"], batch_size=8 if every_rank else 4, every_rank=every_rank
        ),
    }
    return tiny_module(teachers=teachers, partitions=layout)


def _data() -> ImageFolderDataModule:
    # 40 items: 6 steps of 6 at one rank, 3 per rank at two ranks
    return ImageFolderDataModule(
        SAMPLE_IMAGES, crop_size=64, batch_size=BATCH, num_workers=0, repeats=4
    )


def _trainer(module: Any, world: int, rank: int) -> Any:
    return SimpleNamespace(
        world_size=world,
        global_rank=rank,
        lightning_module=module,
        max_steps=-1,
        precision="32-true",
    )


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("grouping")
    config = {"model": {"teachers": {}}, "data": {"class_path": "ImageFolderDataModule"}}
    write_cache(_module(), _data(), config, folder, views=1, ranks=[1, 2])
    return folder


def _compare(
    cache: Path, world: int, mosaic: bool, exact: bool, every_rank: bool = False
) -> dict[str, int]:
    """Run the live step's teachers on each rank's chunks and compare with the cache's
    outputs for them; the number of images compared per teacher."""
    module = _module(mosaic, every_rank)
    plan = module.partitions
    compared = {"clip": 0, "sam": 0}
    for rank in range(world):
        live, cached = _data(), CachedViews(str(cache))
        for data in (live, cached):
            data.trainer = _trainer(module, world, rank)
            data.setup("fit")
        plan.place(world, rank)
        for batch, replay in zip(live.train_dataloader(), cached.train_dataloader(), strict=True):
            assert torch.equal(batch, replay.pixels)
            for chunk in plan.chunks(as_float_images(batch), train=True):
                grid = (chunk.resolution[0] // 16, chunk.resolution[1] // 16)
                sizes = {name: module.teachers[name].view_size(grid) for name in chunk.teachers}
                recorded = replay.teacher_outputs(chunk.rows, chunk.teachers, sizes)
                outputs = run_teachers(module.teachers, chunk.crop, chunk.teachers, grid)
                for name, out in outputs.items():
                    same = torch.equal if exact else partial(torch.allclose, atol=1e-5)
                    assert same(out.features, recorded[name].features), (rank, name)
                    compared[name] += len(out.features)
    return compared


@pytest.mark.parametrize("world", [1, 2])
def test_cached_mosaic_outputs_are_the_live_steps(cache: Path, world: int) -> None:
    compared = _compare(cache, world, mosaic=True, exact=True)
    steps = 6 // world  # per rank; at 2 ranks CLIP runs on rank 0, SAM on rank 1
    assert compared == {"clip": 2 * steps, "sam": 4 * steps}


def test_a_balanced_layouts_cache_holds_each_ranks_live_mosaics(tmp_path: Path) -> None:
    config = {"model": {"teachers": {}}, "data": {"class_path": "ImageFolderDataModule"}}
    write_cache(_module(every_rank=True), _data(), config, tmp_path, views=1, ranks=[2])
    compared = _compare(tmp_path, 2, mosaic=True, exact=True, every_rank=True)
    assert compared == {"clip": 1 * 3 * 2, "sam": 4 * 3 * 2}  # rows x steps x ranks


def test_without_mosaics_another_rank_count_reads_the_teachers_outputs(tmp_path: Path) -> None:
    """A cache of one rank's batches replayed at two ranks: each rank's partition reads rows
    a one-rank step gives the other partition (or none); the writer ran every teacher on
    them too, so they hold its outputs (up to rounding), never NaN."""
    config = {"model": {"teachers": {}}, "data": {"class_path": "ImageFolderDataModule"}}
    write_cache(_module(mosaic=False), _data(), config, tmp_path, views=1, ranks=[1])
    assert _compare(tmp_path, 2, mosaic=False, exact=False) == {"clip": 6, "sam": 12}


def test_a_mosaic_cache_refuses_another_rank_count(tmp_path: Path) -> None:
    config = {"model": {"teachers": {}}, "data": {"class_path": "ImageFolderDataModule"}}
    write_cache(_module(), _data(), config, tmp_path, views=1, ranks=[1])
    cached = CachedViews(str(tmp_path))
    cached.trainer = _trainer(_module(), 2, 0)
    with pytest.raises(ConfigError) as error:
        cached.setup("fit")
    message = str(error.value)
    assert "\n" not in message
    assert "2 rank(s); the cache was written for [1]" in message
    assert "teacher sam's mosaics would pack other images together" in message
    assert "radio-lit cache --ranks 2" in message
