"""configs/recipes/shrink/: a published C-RADIOv4 (its backbone and its shipped adaptor spaces as
teachers, one shared model) into ViT-S/16 and ViT-B/16 students with PHI-S, and its CPU twin,
which starts from the quickstart's student exported in NVlabs' layout."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

import radio_lit
from benchmarks.harness import first_batch, fit_statistics
from radio_lit.export import module_inference_model, save_radio
from radio_lit.normalizers import PhiS
from radio_lit.teachers import RADIOTeacher
from tests.configs.shipped import _build, built, raw
from tests.configs.test_shipped_steps import one_step

pytestmark = pytest.mark.slow

#: C-RADIOv4's shipped adaptors (NVlabs/RADIO README, "Supported Adaptors").
C_RADIO_V4_ADAPTORS = ["siglip2-g", "dino_v3", "sam3"]
RECIPES = {"recipes/shrink/vit-s16.yaml": 384, "recipes/shrink/vit-b16.yaml": 768}
TWIN = "recipes/shrink/quickstart.yaml"
ONE_STEP = ["--trainer.accelerator=cpu", "--trainer.max_steps=1"]


def _one_model(module) -> None:
    """Every RADIO teacher of the run holds the same model: one copy."""
    models = {id(t.model) for t in module.teachers.values() if isinstance(t, RADIOTeacher)}
    assert len(models) == 1


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_the_recipes_distil_the_published_models_outputs_at_real_size(name):
    """The student at its real width (meta device), one teacher per output of the published
    model (its backbone and each shipped adaptor, loaded through transformers with NVlabs'
    code), sharing one model (a tiny stand-in here), PHI-S on each, SAM3 dense only."""
    teachers = raw(name)["model"]["teachers"]
    assert {e["init_args"]["model"] for e in teachers.values()} == {"nvidia/C-RADIOv4-H"}
    assert [e["init_args"]["adaptor"] for e in teachers.values()] == ["backbone"] + list(
        C_RADIO_V4_ADAPTORS
    )
    for entry in teachers.values():
        init = entry["init_args"]
        assert (init["loader"], init["backend"], init["trust_remote_code"]) == (
            "transformers",
            "remote_code",
            True,
        )
    module = built(name).model
    assert module.student.embed_dim == RECIPES[name] and module.student.pos_embed.is_meta
    assert list(module.teachers) == list(teachers)
    _one_model(module)
    assert all(isinstance(module.normalizers[n], PhiS) for n in teachers)
    assert module.teachers["sam3"].summary_dim is None and "sam3" not in module.summary_token
    tokens = module.student.summary_tokens
    assert [module.summary_token[n] for n in module.summary_token] == [
        tokens.index(n) for n in module.summary_token
    ]


@pytest.fixture(scope="module")
def quickstart_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The twin header's first commands, quickly: the quickstart's module (its student and
    teacher names, untrained), its PHI-S statistics fitted on one batch, exported as
    ``radio-lit export --format radio`` writes it."""
    cli = built("quickstart.yaml")
    module = copy.deepcopy(cli.model)  # the shared build stays as built
    fit_statistics(module, first_batch(cli.datamodule))
    path = tmp_path_factory.mktemp("published") / "quickstart.pth"
    return save_radio(module_inference_model(module.eval()), path)


def test_the_cpu_twin_distils_the_exported_quickstart(quickstart_export: Path) -> None:
    """The twin's four teachers are the export's backbone and its three heads, one model for
    all four, and the student, half the quickstart's width, takes an optimizer step."""
    overrides = [
        f"--model.teachers.{name}.init_args.model={quickstart_export}"
        for name in raw(TWIN)["model"]["teachers"]
    ]
    cli = _build(TWIN, size="build", extra=[*ONE_STEP, *overrides])
    module = cli.model
    _one_model(module)
    quickstart = raw("quickstart.yaml")["model"]["student"]["init_args"]["model_kwargs"]
    assert module.student.embed_dim * 2 == quickstart["embed_dim"]
    teachers = module.teachers
    assert {n: t.adaptor for n, t in teachers.items()} == {
        "quickstart": "backbone",
        "clip": "clip",
        "dino": "dino",
        "sam": "sam",
    }
    assert teachers["sam"].summary_dim is None
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        exported = radio_lit.load(quickstart_export)(images)
        ours = {n: t(images, (64, 64)) for n, t in teachers.items()}
    for name, output in ours.items():  # the published model's own outputs are the targets
        expected = exported["backbone" if name == "quickstart" else name]
        # two code paths (the teacher's forward and radio_lit.load's): equal up to float rounding
        torch.testing.assert_close(output.features, expected.features, rtol=1e-5, atol=1e-5)
    one_step(cli)
