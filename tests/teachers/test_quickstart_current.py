"""configs/quickstart-current.yaml (tiny SigLIP2, DINOv3, SAM3 teachers) through `radio-lit fit`."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

import radio_lit
from radio_lit.cli.app import RadioLitCLI
from radio_lit.teachers import DINOv3Teacher, OpenCLIPTeacher, SAM3Teacher

CONFIG = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart-current.yaml")


def test_quickstart_current_builds_todays_teachers() -> None:
    cli = RadioLitCLI(args=["--config", CONFIG], run=False)
    teachers = cli.model.teachers
    assert isinstance(teachers["siglip2"], OpenCLIPTeacher)
    assert teachers["siglip2"].mean == (0.5, 0.5, 0.5)  # SigLIP's statistics, no tag given
    assert isinstance(teachers["dino_v3"], DINOv3Teacher) and teachers["dino_v3"].follow_student
    assert isinstance(teachers["sam3"], SAM3Teacher) and teachers["sam3"].mosaic


@pytest.mark.slow
def test_quickstart_current_trains_and_its_checkpoint_exports(tmp_path: Path) -> None:
    cli = RadioLitCLI(
        args=[
            "fit",
            "--config",
            CONFIG,
            "--trainer.logger.init_args.save_dir",
            str(tmp_path),
            "--trainer.default_root_dir",
            str(tmp_path),
            "--trainer.max_steps",
            "30",  # the evaluation callbacks first run at step 150
        ]
    )
    run_dir = Path(cli.trainer.logger.log_dir)
    events = EventAccumulator(str(run_dir))
    events.Reload()
    for teacher in ("siglip2", "dino_v3", "sam3"):
        values = [e.value for e in events.Scalars(f"train/{teacher}/feature_loss")]
        assert values[-1] < values[0], f"{teacher} feature loss did not fall: {values}"
    model = radio_lit.load(run_dir / "checkpoints" / "last.ckpt")
    with torch.no_grad():
        out = model(torch.rand(1, 3, 64, 64))
    assert set(out) == {"backbone", "siglip2", "dino_v3", "sam3"}
    assert out["dino_v3"].features.shape == (1, 4, 4, 48)
    assert out["sam3"].summary is None
