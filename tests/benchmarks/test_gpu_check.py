"""benchmarks/gpu_check.py on this machine's CPU (its building is every test of tests/configs):
one config through the whole script, and a missing module named with its package."""

from __future__ import annotations

import logging
import warnings

from benchmarks import gpu_check


def test_the_check_runs_a_config_and_prints_its_row(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["gpu_check.py"])
    for name in ("lightning.pytorch", "lightning.fabric"):  # the script quiets them
        monkeypatch.setattr(logging.getLogger(name), "level", logging.getLogger(name).level)
    with warnings.catch_warnings():  # and ignores warnings: not for the tests after this one
        code = gpu_check.main(["--device", "cpu", "--only", "quickstart.yaml", "--steps", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    header = next(line for line in out.splitlines() if line.startswith("config"))
    assert header.split() == ["config", "result", "step", "ms", "peak", "GiB", "note"]
    row = next(line for line in out.splitlines() if line.startswith("quickstart.yaml  "))
    assert row.split()[1] == "pass" and float(row.split()[2]) > 0
    assert "as shipped; 1 partition(s), batch 8" in row
    assert "1 of 1 configs pass on CPU" in out


def test_a_missing_module_is_named_with_the_package_to_install():
    error = ModuleNotFoundError("No module named 'open_clip'", name="open_clip")
    wrapped = ValueError("model.teachers.siglip2_g: could not build")
    wrapped.__cause__ = error
    assert gpu_check.missing_module(wrapped) == (
        "missing module open_clip (pip install open_clip_torch)"
    )
    assert gpu_check.missing_module(ValueError("another problem")) is None
