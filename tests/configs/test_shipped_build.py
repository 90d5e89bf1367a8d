"""Every YAML under configs/ builds as ``radio-lit fit`` builds it: the student at its real
architecture, tiny teachers of the same families and names, every model id one its library
knows, the partitions placed on every rank of the config's world, and each stage's weights
the next stage's shapes (DESIGN.md "Offline and tests"). ``--print_config`` builds nothing."""

from __future__ import annotations

import pytest
import timm
import torch

from benchmarks.gpu_check import config_teachers, own_module, stage_chains, world_size
from radio_lit.module import DistillationModule
from radio_lit.students import CPEViT
from radio_lit.upsamplers import FeatSharpModule
from tests.configs.shipped import (
    CONFIGS,
    ROOT,
    built,
    gpu_recipe,
    model_id_problems,
    raw,
)

pytestmark = pytest.mark.slow

NAMES = sorted(CONFIGS)
CHAINS = stage_chains(list(CONFIGS.values()))


def _kind(entry: dict) -> str:
    return entry["class_path"].rsplit(".", 1)[-1]


def test_every_yaml_under_configs_is_built_on_the_config_it_is_stacked_on():
    on_disk = sorted(str(p.relative_to(ROOT / "configs")) for p in ROOT.glob("configs/**/*.yaml"))
    assert on_disk == NAMES
    full = {c.path for c in CONFIGS.values() if not c.overlay}
    for config in CONFIGS.values():
        assert config.files[-1] == config.path
        assert all(f in full for f in config.files[:-1]), config.name  # a full base
    bases = {c.name: c.files[0].relative_to(ROOT / "configs") for c in CONFIGS.values()}
    assert str(bases["quickstart-eradio.yaml"]) == "quickstart.yaml"  # its comments say so
    assert str(bases["ablations/mse.yaml"]) == "ablations/base.yaml"
    assert str(bases["ablations/c-radio/v2.5.yaml"]) == "ablations/c-radio/base.yaml"
    assert set(CHAINS) == {
        "configs",
        "configs/recipes/am-radio",
        "configs/recipes/c-radio",
        "configs/recipes/phi-s",
    }


@pytest.mark.parametrize("name", NAMES)
def test_every_model_id_is_one_its_library_knows(name):
    """timm names and pretrained tags, open_clip's pretrained list, SAM's model types and
    the form of a Hub id: a typo fails here, not in a user's first job."""
    model = raw(name)["model"]
    entries = {n: entry for n, (_, entry) in config_teachers(raw(name)).items()}
    if not own_module(raw(name)):
        entries["student"] = model["student"]
    problems = {
        key: found
        for key, entry in entries.items()
        if (found := model_id_problems(_kind(entry), entry.get("init_args") or {}))
    }
    assert not problems


def test_the_model_id_check_finds_what_a_user_would_mistype():
    assert model_id_problems("CPEViT", {"model": "vit_huge_patch16_224"})  # not in timm
    assert model_id_problems("DINOv3Teacher", {"model": "vit_7b_patch16_dinov3.lvd1689"})
    assert model_id_problems(
        "OpenCLIPTeacher", {"model_name": "ViT-gopt-16-SigLIP2-384", "pretrained": "webl1"}
    )
    assert model_id_problems("SAMTeacher", {"model_type": "vit_x"})
    assert model_id_problems("SAM3Teacher", {"model": "facebook sam3"})
    assert not model_id_problems("SAM3Teacher", {"model": "/checkpoints/sam3"})  # a directory
    assert not model_id_problems(
        "OpenCLIPTeacher", {"model_name": "ViT-H-14-378-quickgelu", "pretrained": "dfn5b"}
    )


@pytest.mark.parametrize("name", NAMES)
def test_builds_with_its_student_its_teachers_and_its_partitions(name):
    cli = built(name)
    module, model = cli.model, raw(name)["model"]
    if own_module(raw(name)):  # configs/featsharp: an upsampler of a tiny stand-in teacher
        assert isinstance(module, FeatSharpModule)
        assert type(module.teacher).__name__ == _kind(model["init_args"]["teacher"])
        factor = model["init_args"]["upsampler"]["init_args"]["factor"]
        assert module.upsampler.factor == factor
        assert module.upsampler.bias.bias.shape[1:] == module.teacher.grid_size
        return
    assert isinstance(module, DistillationModule)
    # teachers: the config's names and families (tiny stand-ins of a GPU recipe's)
    assert {n: type(t).__name__ for n, t in module.teachers.items()} == {
        n: _kind(entry) for n, entry in model["teachers"].items()
    }
    with_summary = {n for n, t in module.teachers.items() if t.summary_dim is not None}
    assert set(module.summary_token) == with_summary
    assert {n for n, h in module.heads.items() if h.summary is not None} == with_summary
    # the student at the configured architecture (a GPU recipe's on the meta device)
    student, init = module.student, model["student"].get("init_args") or {}
    if isinstance(student, CPEViT):
        assert student.pos_embed.is_meta == gpu_recipe(name)
        with torch.device("meta"):
            reference = timm.create_model(  # shapes only: no weight initialisation
                init.get("model", "vit_base_patch16_224"),
                weight_init="skip",
                **(init.get("model_kwargs") or {}),
            )
        blocks = {k: v.shape for k, v in reference.blocks.state_dict().items()}
        ours = student.blocks.state_dict()
        assert {k: ours[k].shape for k in blocks} == blocks
        assert student.patch_embed.proj.weight.shape == reference.patch_embed.proj.weight.shape
        assert type(student.norm) is type(reference.norm)
    # the partitions on every rank of the config's world (AM-RADIO 4; FSDP2: the same
    # teachers on every rank, so that every rank issues the same collectives)
    world, plan = world_size(raw(name)), module.partitions
    per_rank = raw(name)["data"]["init_args"]["batch_size"]
    try:  # each rank's partitions fit the per-GPU batch, which is no larger than needed
        needs = [plan.place(world, rank) and plan.rank_batch_size(rank) for rank in range(world)]
    finally:
        plan.place(1, 0)
    assert max(n or per_rank for n in needs) == per_rank
    strategy = (raw(name)["trainer"].get("strategy") or {}) if gpu_recipe(name) else {}
    if str(strategy.get("class_path", "")).endswith("ModelParallelStrategy"):
        assert strategy["init_args"]["data_parallel_size"] == world
        assert len({plan.members[p] for p in plan.partitions}) == 1


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_each_stage_takes_the_weights_of_the_one_before_at_real_size(chain):
    """Stage k+1's ``model.init_from`` is stage k's last checkpoint, and its student (and
    EMA) have stage k's shapes at the real architecture; each teacher reads the same summary
    token (the CPU-size chain in test_shipped_steps.py loads real checkpoints)."""
    stages = CHAINS[chain]
    assert raw(stages[0].name)["model"].get("init_from") is None
    for before, after in zip(stages, stages[1:], strict=False):
        logger = raw(before.name)["trainer"]["logger"]["init_args"]
        expected = f"{logger['save_dir']}/{logger['name']}/version_0/checkpoints/last.ckpt"
        assert raw(after.name)["model"]["init_from"] == expected
        old, new = built(before.name).model, built(after.name).model
        carried = ("student.", "ema.student.") if new.ema is not None else ("student.",)
        shapes = {k: v.shape for k, v in old.state_dict().items() if k.startswith(carried)}
        now = {k: v.shape for k, v in new.state_dict().items() if k.startswith(carried)}
        assert now == shapes
        assert old.summary_token.items() <= new.summary_token.items()
