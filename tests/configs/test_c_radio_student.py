"""C-RADIOv4's student as the recipe builds it: C-RADIOv4-H's architecture as timm ports it
(``vit_huge_patch16_radio_v4``: no final norm, a patch embedding without bias, 10 prefix
tokens), one summary token per teacher name declared for the whole run (``summary_tokens``),
checked in one line, and exported in NVlabs/RADIO's layout."""

from __future__ import annotations

import timm
import torch

from radio_lit.cli.app import main
from radio_lit.export import module_inference_model, save_radio
from radio_lit.export.checkpoint import token_slots
from radio_lit.export.convert import radio_incompatibilities
from radio_lit.students import CPEViT
from radio_lit.students.heads import summary_token_slots
from tests.builders import tiny_module, tiny_student
from tests.configs.shipped import ROOT, built
from tests.export.radio_reference import reference_forward
from tests.export.tiny_export import own_outputs

STAGES = [f"recipes/c-radio/stage{i}.yaml" for i in (1, 2, 3)]


def test_the_recipe_student_is_c_radiov4_h_as_timm_ports_it():
    with torch.device("meta"):
        port = timm.create_model("vit_huge_patch16_radio_v4", weight_init="skip")  # shapes
    for stage in STAGES:
        student = built(stage).model.student
        blocks = {k: v.shape for k, v in port.blocks.state_dict().items()}
        assert {k: v.shape for k, v in student.blocks.state_dict().items() if k in blocks} == blocks
        assert (student.embed_dim, len(student.blocks), student.patch_size) == (1280, 32, 16)
        assert student.patch_embed.proj.weight.shape == port.patch_embed.proj.weight.shape
        assert student.patch_embed.proj.bias is None  # NVlabs' bias-free linear embedder
        assert isinstance(student.norm, torch.nn.Identity) and isinstance(
            port.norm, type(student.norm)
        )
        # summary tokens first, then registers: timm's cls_token + 9 reg_tokens
        assert (student.num_cls_tokens, student.num_registers) == (3, 7)
        assert student.num_cls_tokens + student.num_registers == port.num_prefix_tokens == 10
        assert student.grid_side == 128  # CPE over 128 x 128 positions (2048 px)
    slots = [built(stage).model.summary_token for stage in STAGES]
    assert slots == [{"siglip2_g": 0, "dino_v3": 1}] * 3  # SAM3 has no summary
    stage3 = built(STAGES[2]).model
    has_summary = {n: t.summary_dim is not None for n, t in stage3.teachers.items()}
    assert token_slots(has_summary, stage3.student) == {"siglip2_g": 0, "dino_v3": 1, "sam3": 2}


def test_a_patch_embedding_without_bias_computes_the_same(tmp_path):
    """A bias the timm weights have moves into the CPE grid: the same outputs, no bias."""
    kwargs = dict(depth=2, embed_dim=32, num_heads=2)
    vit = timm.create_model("vit_tiny_patch16_224", num_classes=0, **kwargs)
    torch.nn.init.normal_(vit.patch_embed.proj.bias)
    torch.save(vit.state_dict(), tmp_path / "vit.pth")
    students = [
        tiny_student(checkpoint=str(tmp_path / "vit.pth"), patch_embed_bias=bias).eval()
        for bias in (True, False)
    ]
    assert students[1].patch_embed.proj.bias is None
    assert "patch_embed.proj.bias" not in students[1].state_dict()
    for size in [(64, 64), (48, 80)]:
        images = torch.randn(2, 3, *size)
        with torch.no_grad():
            with_bias, without = students[0](images), students[1](images)
        torch.testing.assert_close(without.features, with_bias.features, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(without.summary, with_bias.summary, rtol=1e-5, atol=1e-5)


def test_declared_summary_tokens_fix_each_teachers_slot_in_every_stage():
    student = tiny_student(summary_tokens=["dino", "clip", "sam"])
    assert student.num_cls_tokens == 3
    early = summary_token_slots({"clip": True, "dino": True}, student)  # SAM joins later
    late = summary_token_slots({"clip": True, "dino": True, "sam": False}, student)
    assert early == late == {"dino": 0, "clip": 1}
    for bad, message in [
        (dict(summary_tokens=["clip", "clip"]), "must name each teacher once"),
        (dict(summary_tokens=["clip", "dino"], num_cls_tokens=3), "leave num_cls_tokens out"),
    ]:
        try:
            tiny_student(**bad)
        except ValueError as error:
            assert message in str(error)
        else:
            raise AssertionError(f"{bad} was accepted")


def test_a_teacher_without_a_declared_token_is_one_line_naming_the_key(capsys):
    quickstart = str(ROOT / "configs" / "quickstart.yaml")
    args = ["fit", "--config", quickstart, "--trainer.logger=false"]
    args += ["--model.student.init_args.summary_tokens=[clip, sam]"]
    try:
        main(args)
    except SystemExit as stop:
        assert stop.code == 2
    else:
        raise AssertionError("radio-lit fit accepted a summary teacher without a token")
    err = capsys.readouterr().err.strip().splitlines()
    assert err[0].startswith("radio-lit: error: ") and err[1:] == [
        "(set RADIO_LIT_TRACEBACK=1 for the traceback)"
    ]
    assert "summary_tokens=['clip', 'sam'] has no token for ['dino']" in err[0]
    assert "add them to the list" in err[0]


def test_the_declared_layout_exports_in_radio_format(tmp_path):
    """NVlabs/RADIO's loader, run on the exported file, reads each teacher's summary from its
    declared token (``token_slot``; ``summary_idxs`` from the teacher order) and runs the
    trunk without final norm and the embedder without bias, as radio-lit does."""
    torch.manual_seed(0)
    student = tiny_student(
        summary_tokens=["clip", "dino", "sam"],
        num_registers=2,
        patch_embed_bias=False,
        cpe_align_corners=False,
        model_kwargs=dict(depth=2, embed_dim=32, num_heads=2, final_norm=False),
    )
    module = tiny_module(student=student).eval()
    with torch.no_grad():
        module.student.cls_token.normal_()
    model = module_inference_model(module)
    assert radio_incompatibilities(model.config) == []
    assert [(t["name"], t["token_slot"], t["use_summary"]) for t in model.config["teachers"]] == [
        ("clip", 0, True),
        ("dino", 1, True),
        ("sam", 2, False),
    ]
    path = save_radio(model, tmp_path / "student.pth")
    checkpoint = torch.load(path, map_location="cpu", weights_only=False)
    images = torch.rand(2, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    reference, own = reference_forward(checkpoint, images), own_outputs(module, images)
    close = dict(rtol=1e-4, atol=1e-4)
    for name in ("clip", "dino"):
        torch.testing.assert_close(reference[name][0], own[name][0], **close)
        torch.testing.assert_close(
            reference[name][1].reshape(own[name][1].shape), own[name][1], **close
        )
    assert isinstance(module.student, CPEViT)
