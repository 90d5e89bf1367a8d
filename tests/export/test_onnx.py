"""ONNX export: onnxruntime reproduces ``radio_lit.load``'s outputs from one file at two
batch sizes and, for the CPE ViT (written by ``radio-lit export --format onnx``), at two
resolutions (dynamic height and width); E-RADIO's graph at its fixed resolution."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from radio_lit.cli.app import main
from radio_lit.export import inference_model, load, save_onnx
from radio_lit.export.onnx import output_names
from radio_lit.normalizers import Identity
from radio_lit.students import ERadio, TeacherHeads
from tests.cli.test_readme import unnamed_in_manual
from tests.export.tiny_export import saved_run

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def assert_session_matches(session, model, images: torch.Tensor) -> None:
    names = [o.name for o in session.get_outputs()]
    got = dict(zip(names, session.run(None, {"images": images.numpy()}), strict=True))
    with torch.no_grad():
        expected = model(images)
    for name, out in expected.items():
        np.testing.assert_allclose(
            got[f"{name}.features"], out.features.numpy(), atol=1e-4, rtol=1e-4
        )
        if out.summary is not None:
            np.testing.assert_allclose(
                got[f"{name}.summary"], out.summary.numpy(), atol=1e-4, rtol=1e-4
            )


def test_export_onnx_subcommand_matches_radio_lit_load_at_two_resolutions(
    trained, exported: Path, tmp_path: Path, capsys
) -> None:
    run = tmp_path / "version_0"
    checkpoint = saved_run(trained, run)

    main(["export", str(checkpoint), "--format", "onnx"])

    printed = [Path(p) for p in capsys.readouterr().out.split()]
    path = run / "export" / "last.onnx"
    assert printed == [path, run / "export" / "last.onnx.data"]  # the graph and its weights
    assert all(p.is_file() for p in printed)
    # every file it wrote, named in the manual (tests/cli/test_readme.py leaves ONNX to here)
    written = sorted(str(p.relative_to(path.parent)) for p in path.parent.rglob("*"))
    assert written == ["last.onnx", "last.onnx.data"]
    assert unnamed_in_manual(written) == []
    model = load(exported / "student.safetensors")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    assert names == output_names(model)
    assert "sam.summary" not in names and "clip.summary" in names
    for shape in [(2, 3, 64, 96), (3, 3, 112, 48)]:
        assert_session_matches(session, model, torch.rand(*shape))
    metadata = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert json.loads(metadata["radio_lit_config"])["teachers"] == model.config["teachers"]


def test_eradio_onnx_matches_pytorch_at_two_batch_sizes(tmp_path: Path) -> None:
    """48 x 80 px: a 3 x 5 stride-16 map in 2 x 2 windows (padded), BatchNorm statistics and
    affine parameters away from their initial values."""
    torch.manual_seed(0)
    student = ERadio(width=16, depths=(1, 1, 1, 1), window_size=2, head_dim=16)
    for layer in student.modules():
        if isinstance(layer, torch.nn.BatchNorm2d):
            for tensor in (layer.running_mean, layer.running_var, layer.weight, layer.bias):
                tensor.data.uniform_(0.5, 1.5)
    heads = {"teacher": TeacherHeads(student.embed_dim, 24, 32, 32)}
    teachers = [{"name": "teacher", "type": "generic", "use_summary": True, "token_slot": 0}]
    model = inference_model(
        student.eval(), heads, {"teacher": Identity(32)}, teachers, (0.4,) * 3, (0.2,) * 3, (48, 80)
    )
    session = ort.InferenceSession(
        str(save_onnx(model, tmp_path / "eradio.onnx", (48, 80))),
        providers=["CPUExecutionProvider"],
    )
    for batch in (1, 3):
        assert_session_matches(session, model, torch.rand(batch, 3, 48, 80))
