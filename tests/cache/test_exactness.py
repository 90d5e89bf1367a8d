"""A run from a float32 cache is the live run over the same views, step for step.

The live run draws crops from the shipped photographs (crop seed ``(seed, epoch, index)``)
and a student resolution per step; the cached run replays the views ``radio-lit cache``
stored for epochs 0 and 1. Their losses must be equal (no tolerance, CPU), through statistics
estimation, frozen-trunk steps and a second epoch.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import Callback

from radio_lit.cache import CachedViews
from radio_lit.cache.writer import write_cache
from radio_lit.callbacks import FreezeBody, TeacherStatsEstimation
from radio_lit.data import SAMPLE_IMAGES, ImageFolderDataModule
from radio_lit.normalizers import PhiS
from radio_lit.training.partitions import Partition
from radio_lit.upsamplers import FeatSharp, FusionBlock, UpsampledTeacher
from tests.builders import cpu_trainer, tiny_module
from tests.teachers.tiny import tiny_clip_teacher, tiny_dinov2_teacher, tiny_sam_teacher

STEPS = 4  # 10 images, batch 4: 2 steps per epoch; epochs 0 and 1 replay views 0 and 1


class Losses(Callback):
    def __init__(self) -> None:
        self.values: list[torch.Tensor] = []

    def on_train_batch_end(
        self, trainer: Any, module: Any, outputs: Any, batch: Any, i: int
    ) -> None:
        self.values.append(outputs["loss"].detach().clone())


def _module(partitions: bool | str) -> Any:
    torch.manual_seed(0)  # the same teachers and student in every run
    if not partitions:
        return tiny_module(normalizer=PhiS)
    # two partitions on one rank; the DINOv2 teacher follows the student's two resolutions;
    # SAM packs its partition's 2 views into a mosaic (canvas neighbours, 2 x 2 tiles);
    # "upsampled": CLIP through FeatSharp 2x at the 64 px student's grid (radio_lit.upsamplers)
    clip = tiny_clip_teacher()
    if partitions == "upsampled":
        fusion = functools.partial(FusionBlock, heads=2)
        upsampler = functools.partial(FeatSharp, factor=2, fusion=fusion)
        clip = UpsampledTeacher(clip, upsampler, min_student_grid=4)
        assert clip.view_size((4, 4)) == (112, 112) and clip.view_size((2, 2)) == (56, 56)
    teachers = {
        "clip": clip,
        "dino": tiny_dinov2_teacher(follow_student=True),
        "sam": tiny_sam_teacher(resolution=64, mosaic=True),
    }
    layout = {
        "semantic": Partition(teachers=["clip", "dino"], batch_size=2, resolutions=[32, 64]),
        "sam": Partition(teachers=["sam"], batch_size=2),
    }
    return tiny_module(teachers=teachers, normalizer=PhiS, partitions=layout)


def _data(batch_size: int = 4) -> ImageFolderDataModule:
    return ImageFolderDataModule(SAMPLE_IMAGES, crop_size=96, batch_size=batch_size, num_workers=0)


def _fit(
    module: Any, data: Any, root: Path, *extra: Callback, seed: int = 0, **options: Any
) -> list[torch.Tensor]:
    """The step losses of one fit (``extra`` callbacks and ``Trainer.fit`` / Trainer options
    beside the statistics estimation and frozen trunk of a stage's start)."""
    losses = Losses()
    stats = TeacherStatsEstimation(steps=3, refit_every=1, log_spectrum=False)
    callbacks = [stats, FreezeBody(steps=2), *extra, losses]
    ckpt_path = options.pop("ckpt_path", None)
    torch.manual_seed(seed)  # the step's own draws (student resolution) start alike
    trainer = cpu_trainer(root, max_steps=STEPS, callbacks=callbacks, **options)
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return losses.values


@pytest.mark.slow
@pytest.mark.parametrize(
    "partitions",
    [False, True, "upsampled"],
    ids=["one-partition", "partitions-multires", "upsampled-teacher"],
)
def test_cached_run_equals_live_run(tmp_path: Path, partitions: bool | str) -> None:
    """With two partitions, the data batch (5) is larger than the 4 images the rank's
    partitions use: the live run and the replay both load only those 4 (``use_rows``)."""
    batch = 5 if partitions is True else 4
    data = _data(batch)
    config = {
        "model": {"teachers": {}},
        "data": {"class_path": "ImageFolderDataModule", "init_args": {}},
    }
    write_cache(_module(partitions), data, config, tmp_path / "cache", views=2)

    live = _fit(_module(partitions), _data(batch), tmp_path / "live")
    cached = _fit(_module(partitions), CachedViews(str(tmp_path / "cache")), tmp_path / "cached")

    assert len(live) == len(cached) == STEPS
    differences = [float((a - b).abs()) for a, b in zip(live, cached, strict=True)]
    assert max(differences) == 0.0, differences


class StopAt(Callback):
    """Stops the run after ``step`` optimizer steps, as a preemption would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(
        self, trainer: Any, module: Any, outputs: Any, batch: Any, i: int
    ) -> None:
        if trainer.global_step == self.step:
            trainer.should_stop = True


@pytest.mark.slow
def test_a_run_from_the_cache_resumes_exactly(tmp_path: Path) -> None:
    """Interrupted mid-epoch (step 3 of 4) and resumed from its checkpoint, a run from the
    cache continues with the same views and the same losses."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from radio_lit.callbacks import RandomStates

    config = {"model": {"teachers": {}}, "data": {"class_path": "ImageFolderDataModule"}}
    write_cache(_module(False), _data(), config, tmp_path / "cache", views=2)
    data = lambda: CachedViews(str(tmp_path / "cache"))  # noqa: E731
    whole = _fit(_module(False), data(), tmp_path / "whole")

    saved = ModelCheckpoint(tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)
    first = _fit(
        _module(False),
        data(),
        tmp_path,
        RandomStates(),
        saved,
        StopAt(3),
        enable_checkpointing=True,
    )
    checkpoint = next((tmp_path / "ckpt").glob("*step=3.ckpt"))
    # a fresh process's RNG state, whatever it is: the checkpoint restores the run's
    rest = _fit(
        _module(False), data(), tmp_path, RandomStates(), seed=123, ckpt_path=str(checkpoint)
    )

    assert len(first) == 3 and len(rest) == 1
    assert torch.equal(torch.stack(first + rest), torch.stack(whole))


@pytest.fixture
def two_threads() -> Any:
    """Two intra-op threads: a batch's rows are then split between them, and an image's
    outputs can round differently in another row (the ablation base's SigLIP-like summary)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_every_cached_batch_holds_what_the_live_teachers_return(
    tmp_path: Path, two_threads: None
) -> None:
    """Over a whole epoch of the ablation base, the cache holds bit for bit what the teachers
    return on the live run's batches: the writer runs them on those batches, each image in
    its row."""
    from radio_lit.cli.cache import _build_run
    from radio_lit.data.views import as_float_images
    from radio_lit.training.teachers import run_teachers

    base = Path(__file__).resolve().parents[2] / "configs" / "ablations" / "base.yaml"
    # 20 crops, batch 8: 2 batches (the last 4 dropped); the old item-order layout already
    # differed in the first batch's SigLIP-like summary
    run = _build_run(["--config", str(base), "--data.init_args.repeats", "2"])
    module, data = run.model, run.datamodule
    write_cache(module, data, run.config.as_dict(), tmp_path, views=1)
    data.setup("fit")
    cached = CachedViews(str(tmp_path))
    cached.setup("fit")
    grid = (4, 4)  # the base's 64 px student, patch 16
    batches = 0
    for live, batch in zip(data.train_dataloader(), cached.train_dataloader(), strict=True):
        assert torch.equal(live, batch.pixels)
        sizes = {name: module.teachers[name].view_size(grid) for name in module.teachers}
        recorded = batch.teacher_outputs(slice(None), list(sizes), sizes)
        for name, out in run_teachers(
            module.teachers, as_float_images(live), list(sizes), grid
        ).items():
            assert torch.equal(out.features, recorded[name].features), (batches, name)
            if out.summary is not None:
                assert torch.equal(out.summary, recorded[name].summary), (batches, name)
        batches += 1
    assert batches == 2
