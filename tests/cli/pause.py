"""Test-only parts: a run that stops making progress at a known step (to be SIGKILLed), and a
teacher whose construction waits for the test (a run still building its models)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import lightning.pytorch as pl

from radio_lit.distributed.cluster import launch_rank
from radio_lit.teachers import DINOv2Teacher


class PauseAt(pl.Callback):
    """Before training step ``step``: touch ``flag`` and sleep until killed.

    The checkpoint of the previous step is complete by then, as it is when a real job is
    preempted between two steps; the DataLoader workers keep prefetching meanwhile.
    """

    def __init__(self, step: int, flag: str) -> None:
        super().__init__()
        self.step = step
        self.flag = flag

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step == self.step:
            Path(self.flag).touch()
            while True:
                time.sleep(1)


class BuildsUntil(DINOv2Teacher):
    """The quickstart's DINOv2 teacher, whose construction touches ``flag`` (with the launcher's
    rank appended: ``<flag>-<rank>``) and then waits until ``go`` exists: a run still building
    its models for as long as the test wants (a 7B teacher takes minutes)."""

    def __init__(self, flag: str, go: str, **kwargs: Any) -> None:
        Path(f"{flag}-{launch_rank()}").touch()
        while not Path(go).exists():
            time.sleep(0.05)
        super().__init__(**kwargs)


def building_teacher(flag: Path, go: Path) -> dict:
    """The config entry of ``model.teachers.dino``: the quickstart's DINOv2 teacher as
    :class:`BuildsUntil`."""
    return {
        "class_path": "tests.cli.pause.BuildsUntil",
        "init_args": {
            "flag": str(flag),
            "go": str(go),
            "model": "vit_small_patch14_reg4_dinov2",
            "pretrained": False,
            "model_kwargs": {"depth": 2, "embed_dim": 48, "num_heads": 2, "img_size": 56},
        },
    }
