"""ONNX export: onnxruntime reproduces ``radio_lit.load``'s outputs at two resolutions and two
batch sizes from one file (dynamic batch, height and width for the CPE ViT)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from radio_lit.export import load, module_inference_model, save_onnx
from radio_lit.export.onnx import output_names

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")


def test_onnxruntime_matches_radio_lit_load_at_two_resolutions(trained, exported, tmp_path):
    model = load(exported / "student.safetensors")
    path = save_onnx(module_inference_model(trained), tmp_path / "student.onnx", (64, 64))
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    assert names == output_names(model)
    assert "sam.summary" not in names and "clip.summary" in names
    for shape in [(2, 3, 64, 96), (3, 3, 112, 48)]:
        images = torch.rand(*shape)
        with torch.no_grad():
            expected = model(images)
        got = dict(zip(names, session.run(None, {"images": images.numpy()}), strict=True))
        for name, out in expected.items():
            np.testing.assert_allclose(
                got[f"{name}.features"], out.features.numpy(), atol=1e-4, rtol=1e-4
            )
            if out.summary is not None:
                np.testing.assert_allclose(
                    got[f"{name}.summary"], out.summary.numpy(), atol=1e-4, rtol=1e-4
                )
    metadata = {p.key: p.value for p in onnx.load(str(path)).metadata_props}
    assert json.loads(metadata["radio_lit_config"])["teachers"] == model.config["teachers"]
