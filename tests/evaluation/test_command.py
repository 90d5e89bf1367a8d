"""``radio-lit evaluate`` on an exported model (through ``radio_lit.load``) and its errors."""

from __future__ import annotations

import pytest

import radio_lit
from radio_lit.cli import main
from tests.evaluation.synthetic import MeanColor, dataset_root


class ExportedMeanColor(MeanColor):
    patch_size = 16


def test_an_exported_model_is_evaluated_through_radio_lit_load(tmp_path, monkeypatch, capsys):
    train, evaluation = dataset_root(tmp_path)
    loaded = []
    monkeypatch.setattr(
        radio_lit, "load", lambda path: loaded.append(path) or ExportedMeanColor(), raising=False
    )
    preset = tmp_path / "knn.yaml"
    preset.write_text(
        "trainer:\n  callbacks+:\n    - class_path: radio_lit.evaluation.KNNClassification\n"
        f"      init_args: {{train_dir: {train}, eval_dir: {evaluation}, crop_size: 32}}\n"
    )
    main(
        [
            "evaluate",
            "--model_path",
            "model.safetensors",
            "--resolution",
            "32",
            "--config",
            str(preset),
        ]
    )
    assert loaded == ["model.safetensors"]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["measure", "value", "(step", "0)"]
    assert lines[2].split() == ["eval/knn/backbone/top1", "100"]


def test_without_radio_lit_load_an_exported_model_is_a_clear_error(monkeypatch):
    monkeypatch.delattr(radio_lit, "load", raising=False)
    with pytest.raises(SystemExit, match="no radio_lit.load"):
        main(["evaluate", "--model_path", "model.safetensors", "--resolution", "32"])


def test_a_missing_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(SystemExit, match="does not exist"):
        main(["evaluate", "--ckpt_path", str(tmp_path / "last.ckpt")])
