"""The recipes that start from a published RADIO (``configs/recipes/{adapt,extend}``): the
student starts as the published model and keeps it, frozen, as the teacher of every output it
ships; extend adds one teacher and keeps the old ones; each CPU twin starts from the file its
header's first commands make. (That they build at real size and their twins step:
test_shipped_build.py and test_shipped_steps.py, from :mod:`tests.published_stand_in`.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.configs.shipped import ROOT, raw

ADAPT = ("recipes/adapt/c-radio-v4-h.yaml", "recipes/adapt/quickstart.yaml")
EXTEND = ("recipes/extend/c-radio-v4-h.yaml", "recipes/extend/quickstart.yaml")
#: The adaptor heads each starting model ships (C-RADIOv4's [R4]; the quickstart's teachers).
SHIPPED_HEADS = {
    "c-radio-v4-h": {"siglip2-g", "dino_v3", "sam3"},
    "quickstart": {"clip", "dino", "sam"},
}


def _kind(entry: dict) -> str:
    return entry["class_path"].rsplit(".", 1)[-1]


def _radio_teachers(name: str) -> dict[str, dict]:
    teachers = raw(name)["model"]["teachers"]
    return {n: e["init_args"] for n, e in teachers.items() if _kind(e) == "RADIOTeacher"}


def _callbacks(name: str) -> dict[str, dict]:
    return {
        c["class_path"].rsplit(".", 1)[-1]: c.get("init_args") or {}
        for c in raw(name)["trainer"]["callbacks"]
    }


@pytest.mark.parametrize("name", ADAPT + EXTEND)
def test_the_starting_model_is_the_teacher_of_every_output_it_ships(name):
    """One frozen RADIO teacher per output of the starting model (its backbone and each head,
    teachers named as the heads, so each imported head keeps its own output as target), all of
    the file the student starts from, at the student's resolution (exact at step 0); the trunk
    frozen for the first steps, within the statistics' estimation."""
    model = raw(name)["model"]
    radio = _radio_teachers(name)
    assert {i.get("adaptor", "backbone") for i in radio.values()} == {
        "backbone",
        *SHIPPED_HEADS[Path(name).stem],
    }
    assert all(i.get("adaptor", "backbone") in (n, "backbone") for n, i in radio.items())
    assert {i["model"] for i in radio.values()} == {model["init_from"]}
    assert all(i["follow_student"] for i in radio.values())
    callbacks = _callbacks(name)
    assert 0 < callbacks["FreezeBody"]["steps"] < raw(name)["trainer"]["max_steps"]
    assert callbacks["TeacherStatsEstimation"]["steps"] <= callbacks["FreezeBody"]["steps"]


@pytest.mark.parametrize(("adapt", "extend"), list(zip(ADAPT, EXTEND, strict=True)))
def test_extend_is_adapt_plus_one_generic_teacher(adapt, extend):
    """The old outputs kept as adapt keeps them, one new timm/transformers teacher, the same
    student; where the summary tokens are named (C-RADIOv4's one per teacher), the release's
    in their order, then one for the new teacher (NVlabs' layout: a token per teacher name)."""
    old, new = raw(adapt)["model"], raw(extend)["model"]
    added = [n for n in new["teachers"] if n not in old["teachers"]]
    assert len(added) == 1
    assert _kind(new["teachers"][added[0]]) in ("TimmTeacher", "TransformersTeacher")
    assert {n: new["teachers"][n] for n in old["teachers"]} == old["teachers"]
    student, before = new["student"]["init_args"], old["student"]["init_args"]
    tokens = student.pop("summary_tokens", None), before.pop("summary_tokens", None)
    assert student == before and new["init_from"] == old["init_from"]
    if tokens[1] is not None:
        assert tokens[0] == [*tokens[1], *added]


def _header_commands(name: str) -> list[list[str]]:
    lines = (ROOT / "configs" / name).read_text(encoding="utf-8").splitlines()
    found = [re.match(r"#\s+radio-lit (.*)", line) for line in lines]
    return [shlex.split(m.group(1)) for m in found if m]


@pytest.mark.parametrize("name", [n for n in ADAPT + EXTEND if n.endswith("quickstart.yaml")])
def test_a_twin_starts_from_the_file_its_first_commands_make(name):
    """The header's fit names the run's version, its export writes the file the twin starts
    from (``--output`` without suffix: ``<output>.pth``, NVlabs' layout); the same two commands
    as the shrink twin's, so one file serves the three; the next command trains the twin."""
    fit, export, *rest = _header_commands(name)
    assert fit[:3] == ["fit", "--config", "configs/quickstart.yaml"]
    assert fit[3:] == ["--trainer.logger.init_args.version", "published"]
    logger = raw("quickstart.yaml")["trainer"]["logger"]["init_args"]
    run = Path(logger["save_dir"], logger["name"], "published")
    assert export[:4] == ["export", str(run / "checkpoints" / "last.ckpt"), "--format", "radio"]
    assert export[4] == "--output"
    assert raw(name)["model"]["init_from"] == f"{export[5]}.pth"
    assert rest[0] == ["fit", "--config", f"configs/{name}"]
    assert _header_commands("recipes/shrink/quickstart.yaml")[:2] == [fit, export]


@pytest.mark.slow
def test_the_adapt_twin_starts_as_the_model_it_continues(caplog):
    """Built as ``radio-lit fit`` builds it, from the stand-in of the file its header makes
    (:func:`tests.published_stand_in.radio_stand_in`), the student at step 0 is the starting
    model: its backbone's summary and features and each shipped head's outputs (teacher space,
    before any statistics) are the starting model's to float32 round-off, and so the targets of
    its RADIO teachers; the log names the heads imported and the one that starts fresh."""
    import logging

    import torch

    import radio_lit
    from tests.configs.shipped import _build
    from tests.export.test_init_from_published import assert_reproduces, outputs_in_teacher_space
    from tests.published_stand_in import radio_stand_in

    with caplog.at_level(logging.INFO, logger="radio_lit"):  # a build of its own: its log
        extra = ["--trainer.accelerator=cpu", "--trainer.max_steps=1"]
        module = _build("recipes/adapt/quickstart.yaml", size="build", extra=extra).model
    start = radio_lit.load(radio_stand_in(("clip", "dino", "sam")))
    for size in ((64, 64), (48, 80)):
        images = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            want = {k: (v.summary, v.features) for k, v in start(images).items()}
        got = outputs_in_teacher_space(module.eval(), images)
        summary, features = got["backbone"]  # the export's backbone summary: the first token
        got["backbone"] = (summary[:, 0], features)
        assert_reproduces(got, want)
    logged = " ".join(r.getMessage() for r in caplog.records if "model.init_from" in r.getMessage())
    assert "heads imported {'clip': 'clip', 'dino': 'dino', 'sam': 'sam'}" in logged
    assert "start fresh: ['quickstart']" in logged


@pytest.fixture(scope="module")
def c_radio_layout(tmp_path_factory) -> Path:
    """:func:`c_radio_layout_file` in a folder of the module's."""
    return c_radio_layout_file(tmp_path_factory.mktemp("c-radio"))


def c_radio_layout_file(folder: Path) -> Path:
    """A stand-in for C-RADIOv4-H in NVlabs' layout with the real recipe's token layout (3
    summary tokens named for siglip2-g, dino_v3 and sam3, 7 registers, no final norm, a
    128 x 128 CPE grid, patch embedding without bias) at the recipe's CPU size (width 64,
    depth 2), its heads from tiny teachers of the release's names (sam3 without summary)."""
    import torch

    from benchmarks.gpu_check import CPU_STUDENT
    from radio_lit.export import module_inference_model, save_radio
    from radio_lit.module import DistillationModule
    from radio_lit.students import CPEViT
    from tests.teachers.tiny import tiny_clip_teacher, tiny_sam_teacher

    init = raw(ADAPT[0])["model"]["student"]["init_args"]  # the recipe's, at CPU size
    student = CPEViT(**{**init, "model_kwargs": {**init.get("model_kwargs", {}), **CPU_STUDENT}})
    assert (student.num_cls_tokens, student.num_registers, student.grid_side) == (3, 7, 128)
    torch.manual_seed(0)
    teachers = {"siglip2-g": tiny_clip_teacher(), "dino_v3": tiny_clip_teacher(),
                "sam3": tiny_sam_teacher(resolution=64)}  # fmt: skip
    module = DistillationModule(student=student, teachers=teachers, student_resolution=64)
    return save_radio(module_inference_model(module.eval()), folder / "C-RADIOv4-H.pth")


def test_the_real_size_adapt_recipe_exports_in_nvlabs_layout(c_radio_layout, monkeypatch, tmp_path):  # noqa: E501
    """The real adapt recipe (its token layout; reduced width and depth), started from a file
    of that layout, is exported in NVlabs' layout: its own backbone's entry (``c-radio``) is
    no NVlabs teacher, so the 3 summary tokens meet the release's teachers, and radio_lit.load
    reads it back as the published model (nothing trained)."""
    import torch

    import radio_lit
    import tests.published_stand_in as stand_in
    from radio_lit.export import module_inference_model, read_radio, save_radio
    from tests.configs.shipped import cpu_sized

    monkeypatch.setattr(stand_in, "radio_stand_in", lambda adaptors: c_radio_layout)
    module = cpu_sized(ADAPT[0]).model
    assert module.imported_heads.backbones() == ["c-radio"]
    path = save_radio(module_inference_model(module.eval()), tmp_path / "exported.pth")
    config, _ = read_radio(path)
    assert [t["name"] for t in config["teachers"]] == ["siglip2-g", "dino_v3", "sam3"]
    exported, source = radio_lit.load(path), radio_lit.load(c_radio_layout)
    images = torch.rand(1, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got, want = exported(images), source(images)
    for name, output in want.items():
        torch.testing.assert_close(got[name].features, output.features, rtol=1e-5, atol=1e-5)


def test_the_real_size_extend_recipe_exports_in_nvlabs_layout(
    c_radio_layout, monkeypatch, tmp_path
):  # noqa: E501
    """The real extend recipe (its token layout: the release's 3 summary tokens, then one for
    the new teacher; reduced width and depth), started from a file of the release's layout:
    the new token starts as a copy of the release's first. After an optimizer step its export
    in NVlabs' layout has 4 tokens for its 4 teachers, each teacher at its own token as NVlabs'
    loader reads it (``hubconf.radio_model``: ``token_slot``, else the teacher's index;
    ``summary_idxs``: the teachers with a summary), and radio_lit.load reads back the trained
    student and heads (teacher space), the backbone summary as NVlabs' ``summary_idxs``."""
    import torch

    import radio_lit
    import tests.published_stand_in as stand_in
    from radio_lit.data.views import normalize_view
    from radio_lit.export import module_inference_model, read_radio, save_radio
    from tests.configs.shipped import cpu_sized
    from tests.export.tiny_export import own_outputs

    monkeypatch.setattr(stand_in, "radio_stand_in", lambda adaptors: c_radio_layout)
    cli = cpu_sized(EXTEND[0])
    module = cli.model
    tokens = module.student.cls_token.detach().clone()
    source = read_radio(c_radio_layout)[1]["base_model.patch_generator.cls_token.token"]
    assert torch.equal(tokens[0, :3], source[:3]) and torch.equal(tokens[0, 3], source[0])
    cli.trainer.fit(module, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 1
    path = save_radio(module_inference_model(module.eval()), tmp_path / "extended.pth")
    config, _ = read_radio(path)
    assert config["cls_token_per_teacher"] and config["radio_lit"]["num_cls_tokens"] == 4
    assert [(t["name"], t["use_summary"], t["token_slot"]) for t in config["teachers"]] == [
        ("siglip2-g", True, 0), ("dino_v3", True, 1), ("sam3", False, 2), ("eva02", True, 3)
    ]  # fmt: skip
    exported = radio_lit.load(path, backbone_summary="summary_idxs")
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = exported(images)
        tokens = module.student(normalize_view(images, *module.conditioner.values)).summary
    want = own_outputs(module, images)
    del want["c-radio"]  # the backbone's own entry: the export's backbone, no head of its own
    want["backbone"] = (tokens[:, [0, 1, 3]].flatten(1), want["backbone"][1])  # SAM3's: none
    assert set(got) == set(want) == {"backbone", "siglip2-g", "dino_v3", "sam3", "eva02"}
    for name, (summary, features) in want.items():
        torch.testing.assert_close(got[name].features, features, rtol=1e-5, atol=1e-5)
        if summary is not None:
            torch.testing.assert_close(got[name].summary, summary, rtol=1e-5, atol=1e-5)
