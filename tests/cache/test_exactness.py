"""A run from a float32 cache is the live run over the same views, step for step.

The live run draws crops from the shipped photographs (crop seed ``(seed, epoch, index)``)
and a student resolution per step; the cached run replays the views ``radio-lit cache``
stored for epochs 0 and 1. Their losses must be equal (no tolerance, CPU), through statistics
estimation, frozen-trunk steps and a second epoch.
"""

from __future__ import annotations

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
from radio_lit.partitions import Partition
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


def _module(partitions: bool) -> Any:
    torch.manual_seed(0)  # the same teachers and student in every run
    if not partitions:
        return tiny_module(normalizer=PhiS)
    # two partitions on one rank; the DINOv2 teacher follows the student's two resolutions
    teachers = {
        "clip": tiny_clip_teacher(),
        "dino": tiny_dinov2_teacher(follow_student=True),
        "sam": tiny_sam_teacher(resolution=64),
    }
    layout = {
        "semantic": Partition(teachers=["clip", "dino"], batch_size=2, resolutions=[32, 64]),
        "sam": Partition(teachers=["sam"], batch_size=2),
    }
    return tiny_module(teachers=teachers, normalizer=PhiS, partitions=layout)


def _data() -> ImageFolderDataModule:
    return ImageFolderDataModule(SAMPLE_IMAGES, crop_size=96, batch_size=4, num_workers=0)


def _fit(module: Any, data: Any, root: Path) -> list[torch.Tensor]:
    losses = Losses()
    callbacks = [
        TeacherStatsEstimation(steps=3, refit_every=1, log_spectrum=False),
        FreezeBody(steps=2),
        losses,
    ]
    torch.manual_seed(0)  # the step's own draws (student resolution) start alike
    cpu_trainer(root, max_steps=STEPS, callbacks=callbacks).fit(module, datamodule=data)
    return losses.values


@pytest.mark.slow
@pytest.mark.parametrize("partitions", [False, True], ids=["one-partition", "partitions-multires"])
def test_cached_run_equals_live_run(tmp_path: Path, partitions: bool) -> None:
    data = _data()
    config = {
        "model": {"teachers": {}},
        "data": {"class_path": "ImageFolderDataModule", "init_args": {}},
    }
    write_cache(_module(partitions), data, config, tmp_path / "cache", views=2)

    live = _fit(_module(partitions), _data(), tmp_path / "live")
    cached = _fit(_module(partitions), CachedViews(str(tmp_path / "cache")), tmp_path / "cached")

    assert len(live) == len(cached) == STEPS
    differences = [float((a - b).abs()) for a, b in zip(live, cached, strict=True)]
    assert max(differences) == 0.0, differences
