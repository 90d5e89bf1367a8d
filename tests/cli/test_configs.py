"""Every shipped config is instantiated (quickstart, presets) or parsed (GPU-only recipes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from radio_lit.callbacks import FreezeBody, TeacherStatsEstimation
from radio_lit.cli import RadioLitCLI, main
from radio_lit.module import DistillationModule
from radio_lit.normalizers import PhiS

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")
STAGES = sorted(str(p) for p in (ROOT / "configs").glob("stage*.yaml"))
PRESETS = sorted(str(p) for p in (ROOT / "callbacks").glob("*.yaml"))


def instantiate(*args: str) -> RadioLitCLI:
    return RadioLitCLI(args=list(args), run=False)


def printed_config(capsys, *args: str) -> dict:
    with pytest.raises(SystemExit) as exit_info:
        RadioLitCLI(args=["fit", *args, "--print_config"])
    assert exit_info.value.code in (None, 0)
    return yaml.safe_load(capsys.readouterr().out)


def test_quickstart_instantiates_every_part():
    cli = instantiate("--config", QUICKSTART)
    assert isinstance(cli.model, DistillationModule)
    assert set(cli.model.teachers) == {"clip", "dino", "sam"}
    assert all(isinstance(n, PhiS) for n in cli.model.normalizers.values())
    kinds = {type(c) for c in cli.trainer.callbacks}
    assert {TeacherStatsEstimation, FreezeBody} <= kinds


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: Path(p).name)
def test_callback_presets_compose_with_a_config(preset, tmp_path):
    base = tmp_path / "base.yaml"
    config = yaml.safe_load(Path(QUICKSTART).read_text())
    config["trainer"]["callbacks"] = []
    base.write_text(yaml.safe_dump(config))
    cli = instantiate("--config", str(base), "--config", preset)
    listed = yaml.safe_load(Path(preset).read_text())["trainer"]["callbacks+"]
    names = [type(c).__name__ for c in cli.trainer.callbacks]
    for entry in listed:
        assert entry["class_path"].rsplit(".", 1)[1] in names


@pytest.mark.parametrize("stage", STAGES, ids=lambda p: Path(p).name)
def test_stage_recipes_parse_with_the_papers_hyperparameters(stage, capsys):
    config = printed_config(capsys, "--config", stage)
    trainer, model, data = config["trainer"], config["model"], config["data"]["init_args"]
    # PHI-S table 10: batch 1024, 300k steps, LR 1e-3 cosine, weight decay 0.02, LAMB, bf16.
    assert trainer["devices"] * trainer["num_nodes"] * data["batch_size"] == 1024
    assert trainer["max_steps"] == 300_000 and trainer["precision"] == "bf16-mixed"
    assert model["optimizer"]["class_path"] == "timm.optim.Lamb"
    assert model["optimizer"]["init_args"]["lr"] == 1e-3
    assert model["optimizer"]["init_args"]["weight_decay"] == 0.02
    assert model["normalizer"]["class_path"] == "radio_lit.normalizers.PhiS"
    teachers = {name: t["init_args"] for name, t in model["teachers"].items()}
    assert teachers["dfn_clip"]["model_name"] == "ViT-H-14-378-quickgelu"
    assert teachers["siglip"]["model_name"] == "ViT-SO400M-14-SigLIP-384"
    assert teachers["dino_v2"]["model"].startswith("vit_giant_patch14_reg4_dinov2")
    assert teachers["sam"]["model_type"] == "vit_h"
    callbacks = {
        c["class_path"].rsplit(".", 1)[1]: c.get("init_args", {}) for c in trainer["callbacks"]
    }
    assert callbacks["TeacherStatsEstimation"]["steps"] == 3000
    assert callbacks["FreezeBody"]["steps"] == 5000
    strategy = trainer["strategy"]
    assert strategy["class_path"].endswith("ModelParallelStrategy")
    assert strategy["init_args"]["data_parallel_size"] == trainer["devices"] * trainer["num_nodes"]


def test_stage_resolutions_and_stage2_init_from(capsys):
    stage1 = printed_config(capsys, "--config", str(ROOT / "configs" / "stage1.yaml"))
    stage2 = printed_config(capsys, "--config", str(ROOT / "configs" / "stage2.yaml"))
    assert stage1["model"]["student_resolution"] == 256
    assert stage2["model"]["student_resolution"] == 432
    assert stage1["model"]["init_from"] is None
    assert stage2["model"]["init_from"].endswith(".ckpt")
    # SAM sees the student's view padded to 1024 px, never a feature interpolation.
    assert stage2["model"]["teachers"]["sam"]["init_args"]["resolution"] == 432


@pytest.mark.parametrize(
    "normalizer",
    ["Identity", "GlobalStandardize", "Standardize", "PhiS", "PCAWhiten", "ZCAWhiten", "HCAWhiten"],
)
def test_normalizer_swaps_for_every_teacher_by_one_flag(normalizer):
    cli = instantiate(
        "--config", QUICKSTART, "--model.normalizer", f"radio_lit.normalizers.{normalizer}"
    )
    assert {type(n).__name__ for n in cli.model.normalizers.values()} == {normalizer}


def test_a_teacher_overrides_the_normalizer_and_the_loss_swaps():
    cli = instantiate(
        "--config",
        QUICKSTART,
        "--model.normalizer_overrides",
        '{"sam": "radio_lit.normalizers.GlobalStandardize"}',
        "--model.loss",
        "radio_lit.losses.HybridSmoothL1",
    )
    assert type(cli.model.normalizers["sam"]).__name__ == "GlobalStandardize"
    assert type(cli.model.normalizers["clip"]).__name__ == "PhiS"
    assert type(cli.model.feature_loss).__name__ == "HybridSmoothL1"
    assert cli.model.feature_loss.beta == 0.9


def test_a_wrong_teacher_class_is_a_clear_parse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "fit",
                "--config",
                QUICKSTART,
                "--model.teachers.clip.class_path",
                "radio_lit.teachers.Nope",
            ]
        )
    assert exit_info.value.code == 2
    assert "radio_lit.teachers.Nope" in capsys.readouterr().err
