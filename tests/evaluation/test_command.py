"""``radio-lit evaluate`` on an exported model (through ``radio_lit.load``) and its errors."""

from __future__ import annotations

from pathlib import Path

import pytest

import radio_lit
from radio_lit.cli.app import main
from radio_lit.cli.evaluate import _measures, _run_cli, _runnable
from radio_lit.core.errors import ConfigError
from radio_lit.evaluation import KNNClassification
from radio_lit.evaluation.view import ModelView, module_view
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


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("trainer:\n  max_steps: [1\n", r"not valid YAML \(.* at line 3, column 1\)"),
        ("- trainer\n- model\n", "a YAML mapping of keys is expected, got a list"),
        ("seed_everything: 0\ntrainer:\n  max_steps: 3\n", "no model section"),
    ],
    ids=["cut short", "a list", "no model"],
)
def test_a_run_config_that_is_no_run_config_is_one_line(tmp_path, text, expected):
    given = tmp_path / "config.yaml"
    given.write_text(text)
    with pytest.raises(ConfigError, match=f"--run_config {given}: {expected}"):
        _run_cli(str(given))


def test_it_says_which_measures_run_and_why_any_is_skipped(tmp_path, capsys):
    """An export carries no teachers: zero-shot and mode switching (given, or among the
    defaults) are named as skipped with the option that adds them, the others run."""
    module = tiny_module().eval()
    exported, _ = save_safetensors(module_inference_model(module), tmp_path / "tiny.safetensors")
    preset = tmp_path / "measures.yaml"
    preset.write_text(
        "trainer:\n  callbacks+:\n"
        "    - class_path: radio_lit.evaluation.RankMe\n"
        "      init_args: {crop_size: 32, per_class: 1}\n"
        "    - class_path: radio_lit.evaluation.ZeroShotClassification\n"
        "    - class_path: radio_lit.evaluation.ModeSwitching\n"
    )
    main(["evaluate", "--model_path", str(exported), "--config", str(preset)])
    captured = capsys.readouterr()
    said = [line for line in captured.err.splitlines() if line.startswith("radio-lit evaluate")]
    assert said == [
        "radio-lit evaluate: measures (the given --config): RankMe",
        "radio-lit evaluate: skipped: ZeroShotClassification, ModeSwitching: they compare the "
        "student with its teachers, and an exported model carries no teachers: give "
        "--run_config RUN/config.yaml to build the run's",
    ]
    assert "eval/rankme/backbone/summary" in captured.out


def test_the_defaults_are_seven_and_teacherless_ones_run_without_teachers(capsys):
    measures, origin = _measures(None, [])
    assert origin == "the defaults"
    assert [type(m).__name__ for m in measures] == [
        "KNNClassification",
        "PCAFeatureImages",
        "ScaleEquivariance",
        "RankMe",
        "TokenMerging",
        "ZeroShotClassification",
        "ModeSwitching",
    ]
    view = ModelView(module_inference_model(tiny_module().eval()), (32, 32), 16, {})
    runs = _runnable(measures, view, origin)
    assert [type(m).__name__ for m in runs] == [type(m).__name__ for m in measures[:5]]
    assert "skipped: ZeroShotClassification, ModeSwitching" in capsys.readouterr().err
