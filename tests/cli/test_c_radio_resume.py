"""C-RADIOv4's training state survives a SIGKILL of a real ``radio-lit fit`` (as
test_resume.py does for the quickstart): the quickstart-c-radio run (shifted views, DAMP
noise, the EMA student and MESA, estimated summary dispersions, two resolution partitions,
ViTDet windows) killed while it estimates the teacher statistics and resumed from its last
checkpoint ends where the uninterrupted run does."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from tests import forking
from tests.cli.test_resume import ROOT, kill_when_paused, run_overlay

CONFIG = str(ROOT / "configs" / "quickstart-c-radio.yaml")
STEPS, KILL_AT = 6, 2


def _write(run_dir: Path, pause_at: int | None = None) -> Path:
    statistics = {
        "class_path": "radio_lit.callbacks.TeacherStatsEstimation",
        "init_args": {"steps": 4, "refit_every": 1},
    }
    data = {"val_dir": None, "repeats": 1, "crop_size": 96}
    return run_overlay(run_dir, [statistics], data, STEPS, pause_at)


def _argv(config: Path, *extra: str) -> list[str]:
    return ["fit", "--config", CONFIG, "--config", str(config), *extra]


def _fit(run_dir: Path, *extra: str) -> dict:
    config = run_dir / "run.yaml" if (run_dir / "run.yaml").exists() else _write(run_dir)
    result = forking.run("radio_lit.cli.app:main", [_argv(config, *extra)], run_dir / "fit", 600)
    assert result.exitcode == 0, result.stderr[-4000:]
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.mark.slow
def test_a_killed_c_radio_run_resumes_exactly(tmp_path):
    killed_dir = tmp_path / "killed"
    run = forking.start(
        "radio_lit.cli.app:main",
        [_argv(_write(killed_dir, pause_at=KILL_AT))],
        killed_dir / "killed",
        new_session=True,
    )
    uninterrupted = _fit(tmp_path / "uninterrupted")  # trains while the other run pauses
    deadline = time.monotonic() + 600
    while not (killed_dir / "paused").exists():
        assert run.alive() and time.monotonic() < deadline, run.err.read_text()[-4000:]
        time.sleep(0.2)
    last = kill_when_paused(killed_dir, run, KILL_AT)
    _write(killed_dir)  # the resumed run is a fresh job, without the pause
    resumed = _fit(killed_dir, "--ckpt_path", str(last))
    assert resumed.keys() == uninterrupted.keys()
    assert any(k.startswith("ema.") for k in resumed)
    assert any(k.startswith("dispersions.") for k in resumed)
    for key, value in uninterrupted.items():  # bit for bit
        assert torch.equal(resumed[key], value), key
