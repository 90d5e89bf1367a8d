"""``radio-lit evaluate`` on an exported model (through ``radio_lit.load``) and its errors."""

from __future__ import annotations

from pathlib import Path

import pytest

import radio_lit
from radio_lit.cli import main
from radio_lit.evaluation import KNNClassification
from radio_lit.evaluation.view import module_view
from radio_lit.export import module_inference_model, save_safetensors
from tests.builders import tiny_module
from tests.evaluation.synthetic import MeanColor, dataset_root


class ExportedMeanColor(MeanColor):
    patch_size = 16


def test_an_exported_model_is_evaluated_through_radio_lit_load(tmp_path, monkeypatch, capsys):
    train, evaluation = dataset_root(tmp_path)
    monkeypatch.chdir(tmp_path)
    Path("model.safetensors").touch()  # --model_path is checked to be a file
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
    assert loaded == [Path("model.safetensors")]
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["measure", "value", "(step", "0)"]
    assert lines[2].split() == ["eval/knn/backbone/top1", "100"]


def test_an_exported_model_scores_as_the_module_it_was_exported_from(tmp_path, capsys):
    """``radio-lit evaluate --model_path`` on a real export (safetensors, normalizers folded),
    with no other option than the measures, runs at the resolution the export records and
    gives the kNN accuracy the in-training measure gives on the module itself."""
    train, evaluation = dataset_root(tmp_path)
    module = tiny_module().eval()
    exported, _ = save_safetensors(module_inference_model(module), tmp_path / "tiny.safetensors")
    knn = {"train_dir": str(train), "eval_dir": str(evaluation), "crop_size": 32}
    preset = tmp_path / "knn.yaml"
    preset.write_text(
        "trainer:\n  callbacks+:\n    - class_path: radio_lit.evaluation.KNNClassification\n"
        f"      init_args: {knn}\n".replace("'", "")
    )
    main(["evaluate", "--model_path", str(exported), "--config", str(preset)])
    table = dict(line.split() for line in capsys.readouterr().out.splitlines()[2:])
    own = KNNClassification(**knn).evaluate(module_view(module))
    assert float(table["eval/knn/backbone/top1"]) == pytest.approx(
        own.scalars["eval/knn/backbone/top1"], abs=1e-3
    )


def test_a_missing_checkpoint_is_a_clear_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as stopped:
        main(["evaluate", "--ckpt_path", str(tmp_path / "last.ckpt")])
    assert stopped.value.code == 2
    assert "radio-lit: error: --ckpt_path: checkpoint" in capsys.readouterr().err
