"""A stage-3-shaped run (two resolution partitions, SAM mosaics, DINOv2 following the
student, PHI-S) trains on CPU through ``radio-lit fit`` with the quickstart's tiny models."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from radio_lit.cli.app import RadioLitCLI

ROOT = Path(__file__).resolve().parents[2]
STEPS = 2


def tiny_stage3(tmp_path: Path) -> Path:
    config = yaml.safe_load((ROOT / "configs" / "quickstart.yaml").read_text())
    trainer, model = config["trainer"], config["model"]
    trainer.update(max_steps=STEPS, limit_val_batches=0, enable_checkpointing=True)
    trainer["logger"]["init_args"]["save_dir"] = str(tmp_path)
    trainer["callbacks"] = [
        {"class_path": "radio_lit.callbacks.TeacherStatsEstimation", "init_args": {"steps": STEPS}},
        {
            "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
            "init_args": {"save_last": True},
        },
    ]
    model["teachers"]["dino"]["init_args"]["follow_student"] = True
    model["teachers"]["sam"]["init_args"].update(follow_student=True, mosaic=True)
    del model["teachers"]["sam"]["init_args"]["resolution"]
    model["partitions"] = {  # as configs/stage3.yaml: every teacher in both, 4 + 2 images
        "low_res": {"batch_size": 4, "resolutions": [64]},
        "high_res": {"batch_size": 2, "resolutions": [128]},
    }
    config["data"]["init_args"].update(batch_size=6, crop_size=128)
    path = tmp_path / "tiny_stage3.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_tiny_stage3_trains_through_the_cli(tmp_path):
    cli = RadioLitCLI(args=["fit", "--config", str(tiny_stage3(tmp_path))])
    assert cli.trainer.global_step == STEPS
    checkpoint = Path(cli.trainer.logger.log_dir) / "checkpoints" / "last.ckpt"
    state = torch.load(checkpoint, weights_only=True)["state_dict"]
    # Statistics on each loss grid, both partitions pooled (per step):
    # CLIP native 4x4 for 4 + 2 images; DINOv2 and SAM follow the student: 4 x 4x4 + 2 x 8x8.
    expected = {"clip": 6 * 16, "dino": 4 * 16 + 2 * 64, "sam": 4 * 16 + 2 * 64}
    for name, rows in expected.items():
        assert state[f"normalizers.{name}.count"].item() == STEPS * rows, name
        assert bool(state[f"normalizers.{name}.fitted"])
    metrics = cli.trainer.callback_metrics
    for part in ("low_res", "high_res"):
        for name in ("clip", "dino", "sam"):
            assert torch.isfinite(metrics[f"train/{part}/{name}/feature_loss"])
