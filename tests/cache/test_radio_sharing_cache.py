"""``radio-lit cache`` and ``radio-lit fit`` on the outputs of one shared RADIO model (four
``RADIOTeacher`` entries of one export file): the cache records each output under its own
name, and the run from the cache is the live run, loss for loss."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
from pathlib import Path

import pytest
import yaml

from radio_lit.cache import Manifest
from radio_lit.cli.app import main
from tests.cache.test_cache_command import _run
from tests.export.tiny_export import tiny_radio_export

OUTPUTS = {"c-radio": "backbone", "siglip2-g": "siglip2-g", "dino_v3": "dino_v3", "sam3": "sam3"}


def _config(folder: Path) -> Path:
    model = str(tiny_radio_export())
    teachers = {
        name: {
            "class_path": "radio_lit.teachers.RADIOTeacher",
            "init_args": {"model": model, "adaptor": adaptor, "follow_student": True},
        }
        for name, adaptor in OUTPUTS.items()
    }
    student = {"model": "vit_tiny_patch16_224", "max_resolution": 128}
    student["model_kwargs"] = {"depth": 1, "embed_dim": 32, "num_heads": 2}
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "max_steps": 3,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
        },
        "model": {
            "student": {"class_path": "radio_lit.students.CPEViT", "init_args": student},
            "student_resolution": 32,
            "teachers": teachers,
        },
        "data": {
            "class_path": "radio_lit.data.ImageFolderDataModule",
            "init_args": {
                "train_dir": "radio_lit:sample_images",
                "val_dir": "radio_lit:sample_images",
                "crop_size": 64,
                "batch_size": 4,
                "num_workers": 0,
            },
        },
    }
    path = folder / "run.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.mark.slow
def test_a_shared_models_outputs_are_cached_and_trained_on_as_live(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config, cache = _config(tmp_path), tmp_path / "cache"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main(["cache", "--config", str(config), "--out", str(cache), "--views", "2"])
    manifest = Manifest.load(cache)
    assert sorted(manifest.teachers) == sorted(OUTPUTS)
    assert manifest.teachers["sam3"]["shapes"] == {"sam3/32x32/features": [2, 2, 32]}
    assert manifest.teachers["c-radio"]["shapes"]["c-radio/32x32/summary"] == [32]
    command = shlex.split(printed.getvalue().splitlines()[-1])
    runs = {}
    for name, argv in (("live", ["fit", "--config", str(config)]), ("cached", command[1:])):
        record = {
            "class_path": "tests.cache.test_cache_command.RecordRun",
            "init_args": {"path": str(tmp_path / name)},
        }
        assert _run([*argv, "--trainer.callbacks+", json.dumps(record)], capsys) == (0, "")
        runs[name] = json.loads((tmp_path / name).read_text())
    assert set(runs["cached"]["teachers"].values()) == {"CachedTeacher"}
    assert set(runs["live"]["teachers"].values()) == {"RADIOTeacher"}
    assert len(runs["live"]["losses"]) == 3
    assert runs["cached"]["losses"] == runs["live"]["losses"]  # exactly
    assert runs["cached"]["val"] == runs["live"]["val"]
