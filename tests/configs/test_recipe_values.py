"""The shipped recipes hold the papers' values (read from the files; that they parse and build
is test_shipped_build.py's), and the quickstart builds every part it names."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks.gpu_check import own_module
from radio_lit.callbacks import FreezeBody, TeacherStatsEstimation
from radio_lit.module import DistillationModule
from radio_lit.normalizers import PhiS
from radio_lit.students.sharding import FSDP2
from tests.configs.shipped import CONFIGS, built, gpu_recipe, raw

#: The GPU distillation recipes (configs/featsharp trains upsamplers: tests/upsamplers).
RECIPES = sorted(name for name in CONFIGS if gpu_recipe(name) and not own_module(raw(name)))
#: Recipes that continue a published model (configs/recipes/{adapt,extend}): a fine-tuning
#: schedule of their own [choice], not a training stage's (test_published_recipes.py).
CONTINUED = ("recipes/adapt/", "recipes/extend/")
STAGES = [name for name in RECIPES if not name.startswith(CONTINUED)]
PHI_S_STAGES = [f"stage{i}.yaml" for i in (1, 2, 3)]
PHI_S_STAGES += [f"recipes/phi-s/stage{i}.yaml" for i in (1, 2, 3)]
#: Images per optimizer step: PHI-S table 10 (stages 1-3), AM-RADIO 4 (stage 2: 1,152).
BATCH = {
    "stage3.yaml": 1152,
    "recipes/am-radio/stage2.yaml": 1152,
    "recipes/c-radio/stage1.yaml": 1152,
    "recipes/c-radio/stage2.yaml": 1152,
    "recipes/c-radio/stage3.yaml": 1152,
    "recipes/c-radio/balanced.yaml": 1152,  # stacked on stage 1: the same batches, laid out anew
    "recipes/c-radio/packed.yaml": 1152,  # the balanced layout, each rank's images packed
    "recipes/phi-s/stage3.yaml": 1152,
}


def class_path(entry) -> str:
    """A class entry's class path (a YAML may give it alone, as a string)."""
    return entry if isinstance(entry, str) else entry["class_path"]


def test_quickstart_builds_every_part():
    cli = built("quickstart.yaml")
    assert isinstance(cli.model, DistillationModule)
    assert set(cli.model.teachers) == {"clip", "dino", "sam"}
    assert all(isinstance(n, PhiS) for n in cli.model.normalizers.values())
    kinds = {type(c) for c in cli.trainer.callbacks}
    assert {TeacherStatsEstimation, FreezeBody} <= kinds


@pytest.mark.parametrize("name", STAGES)
def test_every_recipe_has_the_papers_batch_schedule_and_strategy(name):
    """The images per step and the schedule are the paper's; FSDP2 recipes state every FSDP2
    setting (the student one unit: σReparam batched once per step); DDP recipes keep each
    rank's statistics (no buffer broadcast). Their placement: test_shipped_build.py."""
    config = raw(name)
    trainer, model, data = config["trainer"], config["model"], config["data"]["init_args"]
    world = trainer["devices"] * trainer["num_nodes"]
    strategy = trainer["strategy"]
    if strategy["class_path"].endswith("ModelParallelStrategy"):
        assert model["fsdp2"].keys() == {f.name for f in dataclasses.fields(FSDP2)}
        assert FSDP2(**model["fsdp2"]) == FSDP2(layout="student", reduce_dtype="float32")
    else:
        assert strategy == {
            "class_path": "lightning.pytorch.strategies.DDPStrategy",
            "init_args": {"broadcast_buffers": False},
        }
    parts = model.get("partitions") or {}
    total = sum(p["batch_size"] for p in parts.values()) if parts else world * data["batch_size"]
    assert total == BATCH.get(name, 1024)
    assert trainer["max_steps"] == 300_000  # PHI-S table 10; AM-RADIO 4: 2 x 300k
    assert model["optimizer"]["init_args"]["lr"] == 1e-3
    assert model["optimizer"]["init_args"]["weight_decay"] == 0.02
    assert model["warmup_steps"] == 0  # no warm-up in PHI-S table 10 or AM-RADIO 4


@pytest.mark.parametrize("name", RECIPES)
def test_every_recipe_holds_its_frozen_teachers_in_bfloat16(name):
    """The GPU recipes train under bf16-mixed; their frozen teachers are held in bfloat16:
    half their memory and no per-step cast of every weight (README "Teachers on a GPU")."""
    config = raw(name)
    assert config["trainer"]["precision"] == "bf16-mixed"
    teachers = config["model"]["teachers"]
    inner = {n: t["init_args"].get("teacher", t) for n, t in teachers.items()}  # a wrapper's
    dtypes = {n: teacher["init_args"].get("dtype") for n, teacher in inner.items()}
    assert dtypes == dict.fromkeys(teachers, "bfloat16")


@pytest.mark.parametrize("name", PHI_S_STAGES)
def test_stage_recipes_have_the_papers_hyperparameters(name):
    trainer, model = raw(name)["trainer"], raw(name)["model"]
    # PHI-S table 10: 300k steps, LR 1e-3 cosine, weight decay 0.02, LAMB.
    assert trainer["max_steps"] == 300_000 and trainer["precision"] == "bf16-mixed"
    assert model["optimizer"]["class_path"] == "timm.optim.Lamb"
    assert class_path(model["normalizer"]) == "radio_lit.normalizers.PhiS"
    teachers = {n: t["init_args"] for n, t in model["teachers"].items()}
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
    parts = (model.get("partitions") or {}).values()
    sides = {s for p in parts for s in (p.get("resolutions") or [model["student_resolution"]])}
    return sides or {model["student_resolution"]}


def test_radio_v2_5_plan():
    """RADIOv2.5 4.2-4.6: 256, 432, then 432 + 1024 px; one teacher partition; SAM mosaics;
    student features shrunk to the teacher's grid; each stage from the previous one."""
    stages = [raw(f"stage{i}.yaml")["model"] for i in (1, 2, 3)]
    assert [_resolutions(m) for m in stages] == [{256}, {432}, {432, 1024}]
    assert stages[0].get("init_from") is None
    assert "stage1" in stages[1]["init_from"] and "stage2" in stages[2]["init_from"]
    for model in stages:
        assert model["grid_policy"] == "teacher"
        sam = model["teachers"]["sam"]["init_args"]
        assert sam["mosaic"] and sam["follow_student"]
        assert model["teachers"]["dino_v2"]["init_args"]["follow_student"]
        for part in (model.get("partitions") or {}).values():
            assert part.get("teachers") is None  # every teacher sees every image
        assert class_path(model["loss"]).endswith("MSE")
        assert class_path(model["summary_loss"]).endswith("Cosine")


def test_phi_s_gives_each_teacher_its_own_partition():
    """PHI-S 3: 256 images per teacher, teacher features downsampled to the student's grid,
    SAM padded and cropped; stage 3 adds 128 high-resolution images (A.7)."""
    for i, sides in [(1, {256}), (2, {432}), (3, {432, 1024})]:
        model = raw(f"recipes/phi-s/stage{i}.yaml")["model"]
        assert _resolutions(model) == sides
        assert model["grid_policy"] == "student"
        assert not model["teachers"]["sam"]["init_args"].get("mosaic", False)
        parts = model["partitions"]
        assert all(len(p["teachers"]) == 1 for p in parts.values())
        low = [p for p in parts.values() if p.get("resolutions") is None]
        assert sorted(p["teachers"][0] for p in low) == sorted(model["teachers"])
        assert {p["batch_size"] for p in low} == {256}


def test_am_radio_partitions():
    """AM-RADIO 4: CLIP+DINOv2 at 432 px beside SAM at 1024 px on half the GPUs each;
    features compared on the larger grid; no normalization, 0.9 cosine + 0.1 smooth-L1."""
    model = raw("recipes/am-radio/stage2.yaml")["model"]
    parts = model["partitions"]
    assert parts["clip_dino"]["resolutions"] == [432] and parts["sam"]["resolutions"] == [1024]
    assert parts["clip_dino"].get("rank_share", 1.0) == parts["sam"].get("rank_share", 1.0)
    assert parts["sam"]["teachers"] == ["sam"]
    assert model["grid_policy"] == "larger"
    assert class_path(model["normalizer"]) == "radio_lit.normalizers.Identity"
    assert model["loss"]["init_args"]["beta"] == 0.9


def test_c_radio_recipe():
    """C-RADIOv4: SigLIP2-g at 384 px, DINOv3-7B following the student, SAM3 from stage 3
    (RADIO #175) with mosaics; a low partition {128..432} and a high one {512..1152}, every
    teacher in both; the report's training parts on, with the values RADIO #181 and table 3
    give; C-RADIOv4-H's student with one summary-token layout for the whole run."""
    students = []
    for stage in (1, 2, 3):
        model = raw(f"recipes/c-radio/stage{stage}.yaml")["model"]
        teachers = {name: t["init_args"] for name, t in model["teachers"].items()}
        siglip2 = teachers["siglip2_g"]  # FeatSharp 3x from 512 px (32 tokens) [C4 2.2]
        assert siglip2["teacher"]["init_args"]["model_name"] == "ViT-gopt-16-SigLIP2-384"
        assert siglip2["upsampler"]["init_args"]["factor"] == 3
        assert siglip2["min_student_grid"] == 512 // 16
        assert siglip2["checkpoint"].startswith("lightning_logs/featsharp-siglip2-g-384/")
        assert teachers["dino_v3"]["model"].startswith("vit_7b_patch16_dinov3")
        assert teachers["dino_v3"]["follow_student"]
        assert ("sam3" in teachers) == (stage == 3)
        assert (model.get("init_from") is None) == (stage == 1)
        parts = model["partitions"]
        assert parts["low_res"]["resolutions"] == [128, 192, 224, 256, 384, 432]
        assert parts["high_res"]["resolutions"] == [512, 768, 1024, 1152]
        assert all(p.get("teachers") is None for p in parts.values())
        assert model["shifts"]["init_args"]["std"] == 0.5  # RADIO #181
        assert model["mesa"]["init_args"]["decay"] == 0.9996  # RADIO #181
        dispersion = model["summary_loss"]["init_args"]["dispersion"]
        assert dispersion == {"siglip2_g": 0.694, "dino_v3": 2.186}  # report table 3
        weights = {**model["feature_weights"], **model["summary_weights"]}
        assert set(weights.values()) == {1.0}  # RADIO #181 (SAM3 has no summary term)
        assert model["damp"]["init_args"]["std"] > 0
        student = dict(model["student"]["init_args"])
        student.pop("pretrained")  # stage 1 from random weights, later ones from init_from
        students.append(student)
    sam3 = teachers["sam3"]
    assert sam3["mosaic"] and sam3["follow_student"]
    # SAM3 follows the student's grid at 14 px per cell: every view fits its 1008 px canvas
    assert max(parts["high_res"]["resolutions"]) // 16 * 14 <= 1008
    # one student for the whole run: C-RADIOv4-H as timm ports it, 3 summary tokens (one per
    # teacher name) + 7 registers = timm's cls_token + 9 reg_tokens, ViTDet at random
    assert students[0] == students[1] == students[2]
    student = students[0]
    assert student["model"] == "vit_huge_patch16_radio_v4"
    assert student["summary_tokens"] == ["siglip2_g", "dino_v3", "sam3"]
    assert student["num_registers"] == 7 and student["patch_embed_bias"] is False
    assert 0 < student["vitdet_probability"] < 1
    assert student["max_resolution"] == 2048  # 128 x 128 CPE positions
