"""Every shipped config is instantiated (quickstart, presets) or parsed (GPU-only recipes)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest
import yaml

from radio_lit.callbacks import FreezeBody, TeacherStatsEstimation
from radio_lit.cli import RadioLitCLI, main
from radio_lit.module import DistillationModule
from radio_lit.normalizers import PhiS
from radio_lit.partitions import Partition, PartitionPlan
from radio_lit.students.sharding import FSDP2

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")
STAGES = sorted(str(p) for p in (ROOT / "configs").glob("stage*.yaml"))
RECIPES = sorted(str(p) for p in (ROOT / "configs" / "recipes").glob("*/*.yaml"))
PHI_S_STAGES = [str(ROOT / "configs" / f"stage{i}.yaml") for i in (1, 2, 3)] + [
    str(ROOT / "configs" / "recipes" / "phi-s" / f"stage{i}.yaml") for i in (1, 2, 3)
]
#: Images per optimizer step: PHI-S table 10 (stages 1-3), AM-RADIO 4 (stage 2: 1,152).
BATCH = {
    "stage1.yaml": 1024,
    "stage2.yaml": 1024,
    "stage3.yaml": 1152,
    "am-radio/stage1.yaml": 1024,
    "am-radio/stage2.yaml": 1152,
    "c-radio/stage1.yaml": 1152,
    "c-radio/stage2.yaml": 1152,
    "c-radio/stage3.yaml": 1152,
}
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
def test_callback_presets_compose_with_a_config(preset, tmp_path, monkeypatch):
    base = tmp_path / "base.yaml"
    config = yaml.safe_load(Path(QUICKSTART).read_text())
    config["trainer"]["callbacks"] = []
    base.write_text(yaml.safe_dump(config))
    listed = yaml.safe_load(Path(preset).read_text())["trainer"]["callbacks+"]
    # A preset's dataset folder (the segmentation probe's ADE20k root, relative), laid out
    # empty in the scratch folder the preset is read from.
    monkeypatch.chdir(tmp_path)
    for entry in listed:
        root = (entry.get("init_args") or {}).get("root", "radio_lit:")
        for split in ("training", "validation") if not root.startswith("radio_lit:") else ():
            (tmp_path / root / "images" / split).mkdir(parents=True, exist_ok=True)
    cli = instantiate("--config", str(base), "--config", preset)
    names = [type(c).__name__ for c in cli.trainer.callbacks]
    for entry in listed:
        assert entry["class_path"].rsplit(".", 1)[1] in names


_PRINTED: dict[str, dict] = {}


def recipe(capsys, path: str) -> dict:
    """The printed config of a shipped recipe, parsed once per test session."""
    if path not in _PRINTED:
        _PRINTED[path] = printed_config(capsys, "--config", path)
    return copy.deepcopy(_PRINTED[path])


def _name(path: str) -> str:
    return str(Path(path).relative_to(ROOT / "configs")).removeprefix("recipes/")


@pytest.mark.parametrize("path", STAGES + RECIPES, ids=_name)
def test_every_recipe_places_its_batch_on_its_gpus(path, capsys):
    """The partitions of every shipped recipe split over its GPUs, each GPU's share fits in
    the datamodule's per-GPU batch (which is no larger than needed), and the images per step
    are the paper's."""
    config = recipe(capsys, path)
    trainer, model, data = config["trainer"], config["model"], config["data"]["init_args"]
    world = trainer["devices"] * trainer["num_nodes"]
    parts = {n: Partition(**p) for n, p in (model["partitions"] or {}).items()}
    plan = PartitionPlan(parts or None, list(model["teachers"]), (256, 256), 16)
    plan.place(world, 0)
    raw = yaml.safe_load(Path(path).read_text())["trainer"]["strategy"]
    if raw["class_path"].endswith("ModelParallelStrategy"):  # FSDP2: same calls on every rank
        assert raw["init_args"]["data_parallel_size"] == world
        assert len({plan.members[n] for n in plan.partitions}) == 1
        # every FSDP2 setting stated; the student one unit (σReparam batched once per step)
        stated = yaml.safe_load(Path(path).read_text())["model"]["fsdp2"]
        assert stated.keys() == {f.name for f in dataclasses.fields(FSDP2)}
        assert FSDP2(**model["fsdp2"]) == FSDP2(layout="student", reduce_dtype="float32")
    else:  # DDP keeps each rank's statistics (no buffer broadcast)
        assert raw == {
            "class_path": "lightning.pytorch.strategies.DDPStrategy",
            "init_args": {"broadcast_buffers": False},
        }
    needs = [plan.rank_batch_size(rank) for rank in range(world)]
    if parts:
        assert max(needs) == data["batch_size"], needs
        total = sum(p.batch_size for p in parts.values())
    else:
        total = world * data["batch_size"]
    assert total == BATCH.get(_name(path).removeprefix("phi-s/"), 1024)
    assert trainer["max_steps"] == 300_000  # PHI-S table 10; AM-RADIO 4: 2 x 300k
    assert model["optimizer"]["init_args"]["lr"] == 1e-3
    assert model["optimizer"]["init_args"]["weight_decay"] == 0.02
    assert model["warmup_steps"] == 0  # no warm-up in PHI-S table 10 or AM-RADIO 4


@pytest.mark.parametrize("path", STAGES + RECIPES, ids=_name)
def test_every_recipe_holds_its_frozen_teachers_in_bfloat16(path, capsys):
    """The GPU recipes train under bf16-mixed; their frozen teachers are held in bfloat16:
    half their memory and no per-step cast of every weight (README "Teachers on a GPU")."""
    config = recipe(capsys, path)
    assert config["trainer"]["precision"] == "bf16-mixed"
    teachers = config["model"]["teachers"]
    dtypes = {name: teacher["init_args"].get("dtype") for name, teacher in teachers.items()}
    assert dtypes == dict.fromkeys(teachers, "bfloat16")


@pytest.mark.parametrize("stage", PHI_S_STAGES, ids=_name)
def test_stage_recipes_parse_with_the_papers_hyperparameters(stage, capsys):
    config = recipe(capsys, stage)
    trainer, model = config["trainer"], config["model"]
    # PHI-S table 10: 300k steps, LR 1e-3 cosine, weight decay 0.02, LAMB.
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


def _resolutions(model: dict) -> set[int]:
    parts = (model["partitions"] or {}).values()
    sides = {s for p in parts for s in (p["resolutions"] or [model["student_resolution"]])}
    return sides or {model["student_resolution"]}


def test_radio_v2_5_plan(capsys):
    """RADIOv2.5 4.2-4.6: 256, 432, then 432 + 1024 px; one teacher partition; SAM mosaics;
    student features shrunk to the teacher's grid; each stage from the previous one."""
    stages = [recipe(capsys, str(ROOT / "configs" / f"stage{i}.yaml"))["model"] for i in (1, 2, 3)]
    assert [_resolutions(m) for m in stages] == [{256}, {432}, {432, 1024}]
    assert [m["init_from"] for m in stages][0] is None
    assert "stage1" in stages[1]["init_from"] and "stage2" in stages[2]["init_from"]
    for model in stages:
        assert model["grid_policy"] == "teacher"
        sam = model["teachers"]["sam"]["init_args"]
        assert sam["mosaic"] and sam["follow_student"]
        assert model["teachers"]["dino_v2"]["init_args"]["follow_student"]
        for part in (model["partitions"] or {}).values():
            assert part["teachers"] is None  # every teacher sees every image
        assert model["loss"]["class_path"].endswith("MSE")
        assert model["summary_loss"]["class_path"].endswith("Cosine")


def test_phi_s_gives_each_teacher_its_own_partition(capsys):
    """PHI-S 3: 256 images per teacher, teacher features downsampled to the student's grid,
    SAM padded and cropped; stage 3 adds 128 high-resolution images (A.7)."""
    for i, sides in [(1, {256}), (2, {432}), (3, {432, 1024})]:
        path = str(ROOT / "configs" / "recipes" / "phi-s" / f"stage{i}.yaml")
        model = recipe(capsys, path)["model"]
        assert _resolutions(model) == sides
        assert model["grid_policy"] == "student"
        assert not model["teachers"]["sam"]["init_args"]["mosaic"]
        parts = model["partitions"]
        assert all(len(p["teachers"]) == 1 for p in parts.values())
        low = [p for p in parts.values() if p["resolutions"] is None]
        assert sorted(p["teachers"][0] for p in low) == sorted(model["teachers"])
        assert {p["batch_size"] for p in low} == {256}


def test_am_radio_partitions(capsys):
    """AM-RADIO 4: CLIP+DINOv2 at 432 px beside SAM at 1024 px on half the GPUs each;
    features compared on the larger grid; no normalization, 0.9 cosine + 0.1 smooth-L1."""
    path = str(ROOT / "configs" / "recipes" / "am-radio" / "stage2.yaml")
    model = recipe(capsys, path)["model"]
    parts = model["partitions"]
    assert parts["clip_dino"]["resolutions"] == [432] and parts["sam"]["resolutions"] == [1024]
    assert parts["clip_dino"]["rank_share"] == parts["sam"]["rank_share"]
    assert parts["sam"]["teachers"] == ["sam"]
    assert model["grid_policy"] == "larger"
    assert model["normalizer"]["class_path"] == "radio_lit.normalizers.Identity"
    assert model["loss"]["init_args"]["beta"] == 0.9


def test_c_radio_recipe(capsys):
    """C-RADIOv4: SigLIP2-g at 384 px, DINOv3-7B following the student, SAM3 from stage 3
    (RADIO #175) with mosaics; a low partition {128..432} and a high one {512..1152}, every
    teacher in both; the report's training parts on, with the values RADIO #181 and table 3
    give."""
    for stage in (1, 2, 3):
        path = str(ROOT / "configs" / "recipes" / "c-radio" / f"stage{stage}.yaml")
        model = recipe(capsys, path)["model"]
        teachers = {name: t["init_args"] for name, t in model["teachers"].items()}
        assert teachers["siglip2_g"]["model_name"] == "ViT-gopt-16-SigLIP2-384"
        assert teachers["dino_v3"]["model"].startswith("vit_7b_patch16_dinov3")
        assert teachers["dino_v3"]["follow_student"]
        assert ("sam3" in teachers) == (stage == 3)
        assert (model["init_from"] is None) == (stage == 1)
        parts = model["partitions"]
        assert parts["low_res"]["resolutions"] == [128, 192, 224, 256, 384, 432]
        assert parts["high_res"]["resolutions"] == [512, 768, 1024, 1152]
        assert all(p["teachers"] is None for p in parts.values())
        assert model["shifts"]["init_args"]["std"] == 0.5  # RADIO #181
        assert model["mesa"]["init_args"]["decay"] == 0.9996  # RADIO #181
        dispersion = model["summary_loss"]["init_args"]["dispersion"]
        assert dispersion == {"siglip2_g": 0.694, "dino_v3": 2.186}  # report table 3
        weights = {**model["feature_weights"], **model["summary_weights"]}
        assert set(weights.values()) == {1.0}  # RADIO #181 (SAM3 has no summary term)
        assert model["damp"]["init_args"]["std"] > 0
    sam3 = teachers["sam3"]
    assert sam3["mosaic"] and sam3["follow_student"]
    # SAM3 follows the student's grid at 14 px per cell: every view fits its 1008 px canvas
    assert max(parts["high_res"]["resolutions"]) // 16 * 14 <= 1008


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
