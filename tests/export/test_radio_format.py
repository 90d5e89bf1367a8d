"""RADIO-format and safetensors exports, read as NVlabs/RADIO's loader reads them, reproduce
radio-lit's own outputs; ``radio_lit.load`` and ``radio-lit export`` as a user meets them."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
import yaml

import radio_lit
from radio_lit.cli.app import main
from radio_lit.export import module_inference_model, save_radio, save_safetensors
from radio_lit.export.convert import teacher_entry
from tests.builders import tiny_module, tiny_student
from tests.export.radio_reference import (
    ARGS_FIELDS,
    V2_KEYS,
    expected_shapes,
    reference_forward,
)
from tests.export.tiny_export import STUDENT, TEACHERS, own_outputs, saved_run

RESOLUTIONS = [(64, 64), (48, 80), (272, 272)]  # training size, non-square, beyond the grid


def test_radio_file_has_what_the_official_loader_reads(exported: Path) -> None:
    checkpoint = torch.load(exported / "student.pth", map_location="cpu", weights_only=False)
    args, state = checkpoint["args"], checkpoint["state_dict"]
    assert set(vars(args)) >= ARGS_FIELDS
    assert args.mlp_version == "v2" and args.spectral_reparam is False and args.model_norm
    assert args.cls_token_per_teacher and args.cpe_num_registers == 2 and args.cpe_max_size == 256
    assert [(t["name"], t["use_summary"]) for t in args.teachers] == [
        ("clip", True),
        ("dino", True),
        ("sam", False),
    ]
    expected = expected_shapes(args)
    for teacher in ("clip", "dino", "sam"):
        for group in ("_heads", "_feature_projections"):
            expected.update({f"{group}.{teacher}.{k}": None for k in V2_KEYS})
    assert set(state) == set(expected)  # no missing, no unexpected key
    for key, shape in expected.items():
        assert shape is None or tuple(state[key].shape) == shape, key
    assert state["_feature_projections.dino.final.2.weight"].shape == (48, 64)
    assert state["_heads.clip.final.2.weight"].shape == (32, 64)


@pytest.mark.parametrize("size", RESOLUTIONS, ids=lambda s: f"{s[0]}x{s[1]}")
def test_radio_file_reproduces_radio_lit(trained, exported: Path, size) -> None:
    """The format's definition, run on the file, equals radio-lit's own unfolded outputs."""
    images = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(1))
    checkpoint = torch.load(exported / "student.pth", map_location="cpu", weights_only=False)
    reference = reference_forward(checkpoint, images)
    own = own_outputs(trained, images)
    h, w = size[0] // 16, size[1] // 16
    close = dict(rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(reference["backbone"][1], own["backbone"][1].flatten(1, 2), **close)
    # RADIO's backbone summary concatenates the summary tokens of the summary teachers.
    torch.testing.assert_close(reference["backbone"][0][:, :32], own["backbone"][0], **close)
    for name in ("clip", "dino", "sam"):
        summary, features = reference[name]
        torch.testing.assert_close(features.reshape(2, h, w, -1), own[name][1], **close)
        if own[name][0] is not None:
            torch.testing.assert_close(summary, own[name][0], **close)
        else:  # SAM: no summary; the file holds the all-zero head NVlabs' loader builds
            assert summary is None
            state = checkpoint["state_dict"]
            head = [v for k, v in state.items() if k.startswith("_heads.sam.")]
            assert head and all(torch.count_nonzero(v) == 0 for v in head)


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_load_returns_the_inference_model(trained, exported: Path, suffix: str) -> None:
    model = radio_lit.load(exported / f"student{suffix}")
    assert isinstance(model, torch.nn.Module) and not isinstance(model, pl.LightningModule)
    assert not model.training
    images = torch.rand(2, 3, 48, 80, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        outputs = model(images)
    own = own_outputs(trained, images)
    assert list(outputs) == ["backbone", "clip", "dino", "sam"]
    for name, (summary, features) in own.items():
        torch.testing.assert_close(outputs[name].features, features, rtol=1e-4, atol=1e-4)
        if summary is None:
            assert outputs[name].summary is None
        else:
            torch.testing.assert_close(outputs[name].summary, summary, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="pad=True"):
        model(torch.rand(1, 3, 50, 70))


def test_vitdet_eval_windows_are_exported(trained, tmp_path: Path) -> None:
    """A student running ViTDet windows in eval mode (2x2 patches) exports them."""
    trained.student.vitdet_eval_window_size = 2
    try:
        model = module_inference_model(trained)
        path, _ = save_safetensors(model, tmp_path / "windowed.safetensors")
        with pytest.raises(ValueError, match="vitdet_eval_window_size: null"):
            save_radio(model, tmp_path / "windowed.pth")
        images = torch.rand(1, 3, 64, 96)
        with torch.no_grad():
            loaded = radio_lit.load(path)(images)
        own = own_outputs(trained, images)
    finally:
        trained.student.vitdet_eval_window_size = None
    torch.testing.assert_close(loaded["dino"].features, own["dino"][1], rtol=1e-4, atol=1e-4)
    with torch.no_grad():
        unwindowed = own_outputs(trained, images)["dino"][1]
    assert not torch.allclose(loaded["dino"].features, unwindowed, atol=1e-3)


def test_padding_option_accepts_any_resolution(exported: Path) -> None:
    model = radio_lit.load(exported / "student.safetensors", pad=True)
    images = torch.rand(1, 3, 50, 70)
    with torch.no_grad():
        padded = model(images)
        # Padding happens after normalization: the padded pixels are the pixel mean.
        mean = model.input_conditioner.norm_mean
        filled = mean.expand(1, 3, 64, 80).clone()
        filled[..., :50, :70] = images
        direct = radio_lit.load(exported / "student.safetensors")(filled)
    assert padded["dino"].features.shape == (1, 4, 5, 48)
    torch.testing.assert_close(padded["dino"].features, direct["dino"].features)


def test_radio_format_refuses_a_student_it_cannot_express(trained, tmp_path: Path) -> None:
    # Corner-aligned CPE resize, 2 tokens for 3 teachers, a grid as large as timm's img_size.
    student = tiny_student(num_cls_tokens=2, cpe_align_corners=True, max_resolution=224)
    module = tiny_module(student=student, teachers=dict(trained.teachers))
    model = module_inference_model(module)
    fixes = r"cpe_align_corners: false.*summary_tokens: \[.*\].*max_resolution"
    with pytest.raises(ValueError, match=fixes):
        save_radio(model, tmp_path / "student.pth")
    save_safetensors(model, tmp_path / "student.safetensors")  # radio-lit's own format can
    images = torch.rand(1, 3, 48, 80)
    with torch.no_grad():
        loaded = radio_lit.load(tmp_path / "student.safetensors")(images)
    own = own_outputs(module.eval(), images)
    torch.testing.assert_close(loaded["clip"].summary, own["clip"][0], rtol=1e-4, atol=1e-4)


def test_export_subcommand_writes_both_formats(trained, tmp_path: Path, capsys) -> None:
    """``radio-lit export <run>/checkpoints/last.ckpt`` finds the run's config.yaml."""
    run = tmp_path / "version_0"
    checkpoint = saved_run(trained, run)

    umask = os.umask(0o022)
    try:
        main(["export", str(checkpoint)])
    finally:
        os.umask(umask)

    written = capsys.readouterr().out.split()
    assert [Path(p).name for p in written] == ["last.pth", "last.safetensors", "last.json"]
    # every file readable by the group and others, as the umask allows (safetensors: was 0600)
    assert [stat.S_IMODE(os.stat(p).st_mode) for p in written] == [0o644] * 3
    images = torch.rand(2, 3, 64, 64)
    own = own_outputs(trained, images)
    for path in [*written[:2], checkpoint]:  # a training checkpoint loads directly too
        with torch.no_grad():
            outputs = radio_lit.load(path)(images)
        torch.testing.assert_close(outputs["sam"].features, own["sam"][1], rtol=1e-4, atol=1e-4)
    main(["export", str(checkpoint), "--output", str(tmp_path / "named.pth")])  # its suffix
    written = capsys.readouterr().out.split()
    assert [Path(p).name for p in written] == ["named.pth", "named.safetensors", "named.json"]
    checkpoint.rename(tmp_path / "elsewhere.ckpt")
    with pytest.raises(SystemExit) as stopped:
        main(["export", str(tmp_path / "elsewhere.ckpt")])
    assert stopped.value.code == 2
    assert "--config" in capsys.readouterr().err


def test_an_output_blocked_by_a_file_is_named_in_one_line(trained, tmp_path: Path, capsys) -> None:
    checkpoint = saved_run(trained, tmp_path / "version_0")
    (tmp_path / "models").write_text("a file where the export folder should be")
    with pytest.raises(SystemExit) as stopped:
        main(["export", str(checkpoint), "--output", str(tmp_path / "models" / "v1" / "student")])
    assert stopped.value.code == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert f"--output: cannot write into {tmp_path}/models/v1: {tmp_path}/models is a file" in error


def test_a_config_cut_short_is_named_in_one_line(trained, tmp_path: Path, capsys) -> None:
    checkpoint = saved_run(trained, tmp_path / "version_0")
    config = tmp_path / "edited.yaml"
    config.write_text("model:\n  student: {class_path: radio_lit.students.CPEViT\n")
    with pytest.raises(SystemExit) as stopped:
        main(["export", str(checkpoint), "--config", str(config)])
    assert stopped.value.code == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert f"--config {config}: not valid YAML (" in error
    assert "at line 3, column 1)" in error


def test_a_base_without_class_token_is_refused_for_radio_in_one_line(
    trained, tmp_path: Path, capsys
) -> None:
    """A SigLIP-style timm base (no class token) would make RADIO's loader read patch tokens
    as summaries; ``radio-lit export --format radio`` says so in one line, exit 2, and the
    safetensors export still reproduces the student."""
    student_config = {
        "class_path": STUDENT["class_path"],
        "init_args": {
            **STUDENT["init_args"],
            "model_kwargs": {**STUDENT["init_args"]["model_kwargs"], "class_token": False},
        },
    }
    torch.manual_seed(0)
    student = tiny_student(**student_config["init_args"])
    module = tiny_module(student=student, teachers=dict(trained.teachers)).eval()
    run = tmp_path / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    checkpoint = run / "checkpoints" / "last.ckpt"
    torch.save({"state_dict": module.state_dict()}, checkpoint)
    config = {"model": {"student": student_config, "teachers": TEACHERS, "student_resolution": 64}}
    (run / "config.yaml").write_text(yaml.safe_dump(config))

    with pytest.raises(SystemExit) as stopped:
        main(["export", str(checkpoint), "--format", "radio"])
    assert stopped.value.code == 2
    (error,) = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert "no class token" in error and "Traceback" not in error
    assert "model.student.init_args.model_kwargs.class_token: true" in error
    assert not (run / "export" / "last.pth").exists()

    main(["export", str(checkpoint), "--format", "safetensors"])
    written = capsys.readouterr().out.split()
    images = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        loaded = radio_lit.load(written[0])(images)
    own = own_outputs(module, images)
    torch.testing.assert_close(loaded["dino"].features, own["dino"][1], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    ("class_name", "init_args", "expected"),
    [
        (  # open_clip weights by name: RADIO's open_clip adaptor loads the text tower
            "OpenCLIPTeacher",
            {"model_name": "ViT-gopt-16-SigLIP2-384", "pretrained": "webli"},
            {"type": "open_clip", "model": "ViT-gopt-16-SigLIP2-384", "pretrained": "webli"},
        ),
        (
            "OpenCLIPTeacher",
            {"model_name": "tiny", "model_cfg": {"embed_dim": 8}},
            {"type": "clip"},
        ),
        (  # SigLIP2-g from Hugging Face: RADIO's siglip2 adaptor loads its text tower
            "TransformersTeacher",
            {"model": "google/siglip2-giant-opt-patch16-384"},
            {"type": "siglip2", "model": "siglip2-g-384"},
        ),
        (  # random or reshaped weights: no text tower matches them
            "TransformersTeacher",
            {"model": "google/siglip2-giant-opt-patch16-384", "pretrained": False},
            {"type": "generic"},
        ),
        (
            "TransformersTeacher",
            {"model": "facebook/dinov3-vit7b16-pretrain-lvd1689m"},
            {"type": "generic"},
        ),
        ("DINOv3Teacher", {"model": "dinov3_vit7b16"}, {"type": "generic"}),
    ],
)
def test_teacher_entries_name_the_adaptor_radio_loads(class_name, init_args, expected) -> None:
    entry = teacher_entry("t", f"radio_lit.teachers.{class_name}", init_args, True, 1)
    assert entry == {"name": "t", **expected, "use_summary": True, "token_slot": 1}
