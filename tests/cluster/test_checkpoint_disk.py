"""A checkpoint folder that cannot hold a checkpoint is reported before the first step, through
the real ``radio-lit fit``: one line, exit 2, naming the folder and the fix."""

from __future__ import annotations

import shutil
from collections import namedtuple
from pathlib import Path

import pytest

from radio_lit.cli import app as cli

QUICKSTART = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")


def _fit_error(tmp_path: Path, capsys, *extra: str) -> str:
    with pytest.raises(SystemExit) as stop:
        cli.main(["fit", "--config", QUICKSTART, "--trainer.max_steps", "1", *extra])
    assert stop.value.code == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "radio-lit: error:" in x]
    assert not list(tmp_path.rglob("*.ckpt"))  # no step was trained
    return line


@pytest.fixture(autouse=True)
def _in_tmp(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["radio-lit"])


def test_an_unwritable_checkpoint_folder_is_refused_before_training(tmp_path, capsys):
    (tmp_path / "a-file").write_text("not a folder")
    line = _fit_error(
        tmp_path, capsys, "--trainer.logger.init_args.save_dir", str(tmp_path / "a-file" / "logs")
    )
    assert "the checkpoint folder" in line
    assert f"{tmp_path / 'a-file' / 'logs'}" in line and "cannot be written" in line
    assert "--trainer.default_root_dir" in line


def test_a_full_disk_is_refused_before_training(tmp_path, capsys, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(2**30, 2**30 - 4096, 4096))
    line = _fit_error(tmp_path, capsys)
    assert "lightning_logs/quickstart/version_0-max_steps=1/checkpoints has 0.00 GiB free" in line
    assert "a checkpoint of this model with its optimizer state needs about" in line
    assert not list((tmp_path / "lightning_logs" / "quickstart").glob("version_*"))
