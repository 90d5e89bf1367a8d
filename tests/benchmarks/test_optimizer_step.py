"""benchmarks/optimizer_step.py: LAMB eager, LAMB compiled and fused AdamW on one config's
trainable parameters, with the one-off compilation reported."""

import logging
import warnings

import pytest

from benchmarks import optimizer_step


@pytest.mark.slow
def test_the_three_optimizers_are_timed_on_the_quickstarts_parameters(monkeypatch, capsys):
    for name in ("lightning.pytorch", "lightning.fabric"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.getLogger(name).level)
    with warnings.catch_warnings():  # the script ignores warnings: not for later tests
        optimizer_step.main(["--config=configs/quickstart.yaml", "--warmup=1", "--steps=2"])
    lines = capsys.readouterr().out.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("optimizer")))
    rows = {line[:16].strip(): line[16:].split() for line in lines[header + 1 : header + 4]}
    assert list(rows) == ["LAMB eager", "LAMB compiled", "AdamW fused"]
    assert all(float(ms) > 0 for ms, _ in rows.values()) and rows["AdamW fused"][1] == "1.00"
    compiled = next(line for line in lines if line.startswith("compilation:"))
    assert "(1 graph(s), 1 frame(s))" in compiled, compiled  # no graph break, no recompile
    assert lines[-1].startswith("ratio (LAMB compiled / LAMB eager): ")
