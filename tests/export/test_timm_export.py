"""``radio-lit export --format timm``: a folder that timm's C-RADIO classes (``naflexvit_*`` at
every resolution, ``vit_*`` at its ``img_size``) and transformers' native ``RadioModel`` load
with ``radio_lit.load``'s features and summary tokens; what they cannot represent is refused
in one line."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import timm
import torch
import yaml
from transformers import AutoModel, RadioModel

import radio_lit
from radio_lit.cli.app import main
from radio_lit.export import checkpoint_inference_model, inference_model, module_inference_model
from radio_lit.export.model import PatchGenerator, RadioBackbone
from radio_lit.export.timm_radio import save_timm, timm_model
from radio_lit.normalizers import Identity
from radio_lit.students import CPEViT, ERadio, TeacherHeads
from radio_lit.teachers import RADIOTeacher
from tests.builders import cpu_trainer, image_batches, tiny_module, tiny_student
from tests.export.tiny_export import TEACHERS

#: A tiny student shaped as C-RADIOv4-H (timm's ``vit_huge_patch16_radio_v4``): patch 16,
#: 3 summary tokens (one per teacher, SAM's unused) then 7 registers, 10 prefix tokens as
#: timm's ``reg_tokens=9``; no final norm; CPE with RADIO's resize; σReparam (folded).
C_RADIO_STUDENT = {
    "class_path": "radio_lit.students.CPEViT",
    "init_args": {
        "model": "vit_tiny_patch16_224",
        "max_resolution": 256,
        "model_kwargs": {"depth": 2, "embed_dim": 32, "num_heads": 2, "final_norm": False},
        "num_cls_tokens": 3,
        "num_registers": 7,
        "cpe_align_corners": False,
    },
}
#: The training resolution, a non-square one, and one beyond the 16 x 16 CPE grid.
RESOLUTIONS = [(64, 64), (48, 80), (272, 272)]
EXACT = dict(rtol=0, atol=1e-5)


def _saved_run(module, student: dict, folder: Path) -> Path:
    """``module`` as ``radio-lit fit`` leaves a run: ``checkpoints/last.ckpt`` (returned) and
    ``config.yaml`` (student ``student``, the tiny teachers, 64 px)."""
    checkpoint = folder / "checkpoints" / "last.ckpt"
    checkpoint.parent.mkdir(parents=True)
    torch.save({"state_dict": module.state_dict()}, checkpoint)
    model = {"student": student, "teachers": TEACHERS, "student_resolution": 64}
    (folder / "config.yaml").write_text(yaml.safe_dump({"model": model}))
    return checkpoint


@pytest.fixture(scope="module")
def c_radio_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The checkpoint of a C-RADIOv4-H-shaped tiny student trained for one step."""
    torch.manual_seed(0)
    module = tiny_module(student=tiny_student(**C_RADIO_STUDENT["init_args"]))
    root = tmp_path_factory.mktemp("c_radio")
    cpu_trainer(root, max_steps=1).fit(module, image_batches(num_images=4, batch_size=4))
    # the patch bias the export folds into the CPE grid (timm's conv gets a zero bias)
    assert module.student.patch_embed.proj.bias.abs().min() > 0
    return _saved_run(module.eval(), C_RADIO_STUDENT, root / "version_0")


@pytest.fixture(scope="module")
def exported(c_radio_run: Path) -> tuple[Path, list[str]]:
    """The folder ``radio-lit export CKPT --format timm`` writes, and the lines it prints."""
    out = c_radio_run.parent.parent / "export" / "last-timm"
    main(["export", str(c_radio_run), "--format", "timm"])
    assert (out / "config.json").is_file()
    return out, json.loads((out / "config.json").read_text())["radio_lit"]["calls"]


def _timm_inputs(model: torch.nn.Module, images: torch.Tensor) -> torch.Tensor:
    """``images`` in ``[0, 1]`` normalized as timm's data config of ``model`` says (the
    export's ``pretrained_cfg_overlay``)."""
    config = timm.data.resolve_data_config({}, model=model)
    mean = torch.tensor(config["mean"]).view(3, 1, 1)
    std = torch.tensor(config["std"]).view(3, 1, 1)
    return (images - mean) / std


def test_timm_and_transformers_load_the_export_with_radio_lits_features(
    c_radio_run: Path, exported: tuple[Path, dict]
) -> None:
    folder, calls = exported
    config = json.loads((folder / "config.json").read_text())
    timm_entry = config["radio_lit"]["timm"]
    assert timm_entry["model"] == "naflexvit_huge_patch16_radio_v4"
    assert timm_entry["fixed_size_model"] == "vit_huge_patch16_radio_v4"
    # C-RADIOv4-H's token layout is timm's default: only the widths are overridden
    assert timm_entry["fixed_size_kwargs"] == {
        "embed_dim": 32,
        "depth": 2,
        "num_heads": 2,
        "img_size": 64,
    }
    assert config["summary_idxs"] == [0, 1] and config["num_registers"] == 7
    reference = radio_lit.load(c_radio_run)
    naflex = eval(calls["naflexvit"], {"timm": timm}).eval()  # the exact printed call
    hf = AutoModel.from_pretrained(folder).eval()  # transformers' own class: no remote code
    assert isinstance(hf, RadioModel)
    for height, width in RESOLUTIONS:
        images = torch.rand(2, 3, height, width, generator=torch.Generator().manual_seed(height))
        if (height, width) == (64, 64):
            vit = eval(calls["vit"], {"timm": timm}).eval()
        else:  # the vit_* class is exact at its img_size: the user passes the size
            kwargs = {**timm_entry["fixed_size_kwargs"], "img_size": (height, width)}
            overlay = {
                "file": str(folder / "model.safetensors"),
                **timm_entry["pretrained_cfg_overlay"],
            }
            vit = timm.create_model(
                timm_entry["fixed_size_model"],
                pretrained=True,
                pretrained_cfg_overlay=overlay,
                **kwargs,
            ).eval()
        with torch.no_grad():
            expected = reference(images)
            tokens = reference.base_model(reference.input_conditioner(images))
            from_hf = hf(images)
            for model in (naflex, vit):
                got = model.forward_features(_timm_inputs(model, images))
                assert got.shape == tokens.shape  # 10 prefix tokens, then the patch grid
                features = expected["backbone"].features.flatten(1, 2)
                torch.testing.assert_close(got[:, 10:], features, **EXACT)
                torch.testing.assert_close(got[:, :3], tokens[:, :3], **EXACT)  # summary tokens
                for name, slot in config["radio_lit"]["summary_slots"].items():
                    summary = reference._heads[name](got[:, slot])
                    torch.testing.assert_close(summary, expected[name].summary, **EXACT)
        torch.testing.assert_close(from_hf.features, features, **EXACT)
        # RADIO's summary: the summary teachers' tokens concatenated (clip's, dino's)
        torch.testing.assert_close(from_hf.summary, tokens[:, :2].flatten(1), **EXACT)


def test_the_export_prints_the_calls_it_records(c_radio_run: Path, tmp_path: Path, capsys) -> None:
    main(["export", str(c_radio_run), "--format", "timm", "--output", str(tmp_path / "out")])
    lines = capsys.readouterr().out.splitlines()
    calls = json.loads((tmp_path / "out" / "config.json").read_text())["radio_lit"]["calls"]
    assert lines[:2] == [
        str(tmp_path / "out" / "model.safetensors"),
        str(tmp_path / "out" / "config.json"),
    ]
    # each call says which input its model takes (transformers' RadioModel normalizes pixels
    # in [0, 1] itself; timm's classes take them normalized: fed the other, they are far off)
    timm_input = "input: normalized pixels, (x - mean) / std of timm.data.resolve_data_config"
    assert lines[2].startswith(calls["naflexvit"] + "  # any resolution; " + timm_input)
    assert lines[3].startswith(calls["vit"] + "  # exact at 64x64 px only; " + timm_input)
    assert lines[4] == (
        f"transformers.RadioModel.from_pretrained('{tmp_path / 'out'}')  # input: pixels in "
        "[0, 1] (RadioModel normalizes them itself)"
    )
    # radio_lit.load of that folder names what loads it instead
    with pytest.raises(ValueError, match=r"is a radio-lit export --format timm folder") as error:
        radio_lit.load(tmp_path / "out")
    assert calls["transformers"] in str(error.value) and "\n" not in str(error.value)


def test_ema_weights_are_what_timm_loads(c_radio_run: Path, tmp_path: Path) -> None:
    state = torch.load(c_radio_run, weights_only=True)
    weights = state["state_dict"]
    for key in [k for k in weights if k.startswith(("student.", "heads."))]:
        weights["ema." + key] = (
            weights[key] + 0.02 if weights[key].is_floating_point() else weights[key]
        )
    run = tmp_path / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    checkpoint = run / "checkpoints" / "last.ckpt"
    torch.save(state, checkpoint)
    (run / "config.yaml").write_text((c_radio_run.parent.parent / "config.yaml").read_text())
    main(["export", str(checkpoint), "--format", "timm", "--ema"])
    config = json.loads((run / "export" / "last-ema-timm" / "config.json").read_text())
    assert config["radio_lit"]["source"]["weights"] == "ema"
    calls = config["radio_lit"]["calls"]
    model = eval(calls["naflexvit"], {"timm": timm}).eval()
    images = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        got = model.forward_features(_timm_inputs(model, images))[:, 10:]
        ema = checkpoint_inference_model(checkpoint, ema=True)(images)
        raw = radio_lit.load(checkpoint)(images)
    torch.testing.assert_close(got, ema["backbone"].features.flatten(1, 2), **EXACT)
    assert not torch.allclose(got, raw["backbone"].features.flatten(1, 2), atol=1e-3)


def test_layer_scale_no_patch_bias_and_other_widths_load_too(tmp_path: Path) -> None:
    """One summary token, one register, MLP ratio 2, LayerScale (folded into the projections),
    a patch embedding without bias: the kwargs say so and both libraries reproduce it."""
    torch.manual_seed(1)
    student = tiny_student(
        model_kwargs={
            "depth": 2,
            "embed_dim": 32,
            "num_heads": 4,
            "mlp_ratio": 2.0,
            "init_values": 0.5,
            "final_norm": False,
        },  # fmt: skip
        num_cls_tokens=1,
        num_registers=1,
        cpe_align_corners=False,
        spectral_reparam=False,
    )
    student.patch_embed.proj.bias = None
    with torch.no_grad():
        for block in student.blocks:
            block.ls1.gamma.uniform_(0.5, 1.5)
            block.ls2.gamma.uniform_(-1.0, 1.0)
    model = module_inference_model(tiny_module(student=student).eval())
    _, calls = save_timm(model, tmp_path)
    kwargs = json.loads((tmp_path / "config.json").read_text())["radio_lit"]["timm"]["kwargs"]
    assert kwargs == {
        "embed_dim": 32, "depth": 2, "num_heads": 4, "mlp_ratio": 2.0, "reg_tokens": 1,
        "pos_embed_grid_size": [16, 16],
    }  # fmt: skip
    naflex = eval(calls[0].split("  #")[0], {"timm": timm}).eval()
    hf = RadioModel.from_pretrained(tmp_path).eval()
    for size in [(64, 64), (80, 48)]:
        images = torch.rand(2, 3, *size)
        with torch.no_grad():
            expected = model(images)["backbone"]
            got = naflex.forward_features(_timm_inputs(naflex, images))
            from_hf = hf(images)
        torch.testing.assert_close(got[:, 2:], expected.features.flatten(1, 2), **EXACT)
        torch.testing.assert_close(got[:, 0], expected.summary, **EXACT)
        torch.testing.assert_close(from_hf.features, expected.features.flatten(1, 2), **EXACT)


@pytest.mark.parametrize(
    ("change", "own_weights", "message"),
    [
        (
            {"model_kwargs": {"depth": 2, "embed_dim": 32, "num_heads": 2}},  # a final norm
            True,
            "the student has a final norm (norm.*), which timm's C-RADIO classes do not have "
            "(final_norm=False) and drop on load, so the features would be wrong: train with "
            "model.student.init_args.model_kwargs.final_norm: false",
        ),
        (
            {"num_cls_tokens": 1, "num_registers": 0},
            True,
            "the student has one prefix token and no registers, and timm's C-RADIO reader always "
            "gives its classes registers (the tokens after the first): train with "
            "model.student.init_args.num_registers: 1 or more",
        ),
        (
            {"vitdet_eval_window_size": 2},
            False,
            "attends within ViTDet windows at inference, which timm's C-RADIO classes do not: "
            "export with model.student.init_args.vitdet_eval_window_size: null",
        ),
        (
            {"cpe_align_corners": True},
            False,
            "align_corners=True at inference, transformers' RadioModel and timm's C-RADIOv4 "
            "classes without: export with model.student.init_args.cpe_align_corners: false",
        ),
        (
            {
                "model_kwargs": {
                    **C_RADIO_STUDENT["init_args"]["model_kwargs"],
                    "act_layer": "quick_gelu",
                }
            },
            False,
            "the student's blocks differ from timm's vit_huge_patch16_radio_v4 (blocks.0.mlp.act: "
            "QuickGELU here, GELU in timm)",
        ),
    ],
    ids=["final norm", "one token", "vitdet", "align_corners", "activation"],
)
def test_what_timm_cannot_represent_is_refused_in_one_line(
    c_radio_run: Path, tmp_path: Path, capsys, change: dict, own_weights: bool, message: str
) -> None:
    """Options that change no weight are refused with the trained checkpoint and a config
    that sets them (``--config``); a final norm or another token count, with their own."""
    student = copy.deepcopy(C_RADIO_STUDENT)
    student["init_args"].update(change)
    out = tmp_path / "out"
    if own_weights:
        module = tiny_module(student=tiny_student(**student["init_args"])).eval()
        checkpoint, config = _saved_run(module, student, tmp_path / "version_0"), []
    else:
        checkpoint, config = c_radio_run, ["--config", str(tmp_path / "config.yaml")]
        model = {"student": student, "teachers": TEACHERS, "student_resolution": 64}
        (tmp_path / "config.yaml").write_text(yaml.safe_dump({"model": model}))
    with pytest.raises(SystemExit) as stopped:
        main(["export", str(checkpoint), "--format", "timm", "--output", str(out), *config])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    (error,) = [line for line in err.splitlines() if "error:" in line]
    assert message in error and "Traceback" not in err
    assert error.startswith("radio-lit: error: radio-lit export --format timm: ")
    assert not (out / "model.safetensors").exists()


def test_an_eradio_student_is_refused(tmp_path: Path) -> None:
    student = ERadio(width=16, depths=(1, 1, 1, 1), window_size=2, head_dim=16).eval()
    heads = {"t": TeacherHeads(student.embed_dim, 24, 32, 32)}
    teachers = [{"name": "t", "type": "generic", "use_summary": True, "token_slot": 0}]
    model = inference_model(
        student, heads, {"t": Identity(32)}, teachers, (0.5,) * 3, (0.5,) * 3, (64, 64)
    )
    with pytest.raises(ValueError, match="E-RADIO student is no ViT.*--format safetensors or onnx"):
        save_timm(model, tmp_path)


def test_a_radio_teacher_reads_the_export_natively(c_radio_run: Path, exported) -> None:
    """``RADIOTeacher`` with ``loader: transformers`` (native by default) takes the folder:
    the student's features, and RADIO's summary (its summary teachers' tokens)."""
    folder, _ = exported
    teacher = RADIOTeacher(str(folder), loader="transformers", follow_student=True)
    assert teacher.resolution == 64  # the training resolution, from config.json
    images = torch.rand(2, 3, 48, 80)
    reference = radio_lit.load(c_radio_run)
    with torch.no_grad():
        out = teacher(images, (48, 80))
        tokens = reference.base_model(reference.input_conditioner(images))
        features = reference(images)["backbone"].features
    torch.testing.assert_close(out.features, features, **EXACT)
    torch.testing.assert_close(out.summary, tokens[:, :2].flatten(1), **EXACT)


def test_a_c_radio_v4_h_shaped_student_is_timms_class_without_overrides() -> None:
    """At real widths (built on the meta device): ViT-H/16, 3 summary tokens + 7 registers,
    no final norm, a 128 x 128 CPE grid is ``vit_huge_patch16_radio_v4`` as timm ships it;
    only the ``vit_*`` class's fixed size is the training resolution's."""
    with torch.device("meta"):
        student = CPEViT(
            model="vit_base_patch16_224",
            model_kwargs={
                **{"embed_dim": 1280, "depth": 32, "num_heads": 16, "final_norm": False},
                "weight_init": "skip",  # no initialization on the meta device
            },
            num_cls_tokens=3,
            num_registers=7,
            spectral_reparam=False,
        )
        generator = PatchGenerator(16, 1280, student.grid_side, 10)
    chosen = timm_model(RadioBackbone(generator, student.blocks, student.norm), (432, 432))
    assert (chosen.name, chosen.naflex_name) == (
        "vit_huge_patch16_radio_v4",
        "naflexvit_huge_patch16_radio_v4",
    )
    assert chosen.kwargs == chosen.naflex_kwargs == {} and chosen.vit_kwargs == {"img_size": 432}
