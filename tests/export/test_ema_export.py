"""Exporting the EMA student and heads (``radio-lit export --ema``; C-RADIOv4 report 2.3.2)."""

from __future__ import annotations

import pytest
import torch

from radio_lit.cli.app import main
from radio_lit.export.checkpoint import checkpoint_inference_model
from tests.export.tiny_export import saved_run


def test_ema_weights_are_exported_instead_of_the_raw_ones(trained, tmp_path):
    checkpoint = saved_run(trained, tmp_path)
    with pytest.raises(ValueError, match=r"no EMA weights \(ema\.\*\).*without --ema"):
        checkpoint_inference_model(checkpoint, ema=True)
    state = torch.load(checkpoint, weights_only=True)
    weights = state["state_dict"]
    for key in [k for k in weights if k.startswith(("student.", "heads."))]:
        weights["ema." + key] = (
            weights[key] + 0.25 if weights[key].is_floating_point() else (weights[key])
        )
    torch.save(state, checkpoint)
    swapped = tmp_path / "swapped"  # the raw weights replaced by the EMA's, no ema.*
    averaged = {k[len("ema.") :]: v for k, v in weights.items() if k.startswith("ema.")}
    saved = saved_run(trained, swapped)
    kept = {k: v for k, v in weights.items() if not k.startswith("ema.")}
    torch.save({"state_dict": {**kept, **averaged}}, saved)
    images = torch.rand(2, 3, 64, 64)
    with torch.no_grad():
        raw = checkpoint_inference_model(checkpoint)(images)
        ema = checkpoint_inference_model(checkpoint, ema=True)(images)
        expected = checkpoint_inference_model(saved)(images)
    for name, out in expected.items():
        assert torch.equal(ema[name].features, out.features), name
        assert not torch.equal(raw[name].features, out.features), name


def test_export_ema_of_a_run_without_it_is_one_line_and_no_bar(trained, tmp_path, capsys):
    """The refusal stands alone: the progress bar begun before it is erased."""
    checkpoint = saved_run(trained, tmp_path)
    for extra in ([], ["--format", "hf"]):
        with pytest.raises(SystemExit) as stopped:
            main(["export", str(checkpoint), "--ema", *extra])
        assert stopped.value.code == 2
        shown = [line.rsplit("\r", 1)[-1].strip() for line in capsys.readouterr().err.split("\n")]
        shown = [line for line in shown if line]  # what a terminal shows once \r has moved back
        assert len(shown) == 2 and shown[1].startswith("(set RADIO_LIT_TRACEBACK=1"), shown
        assert shown[0].startswith("radio-lit: error: ") and "holds no EMA weights" in shown[0]
