"""benchmarks/adapt_drift.py: drift from the starting model with and without it as a teacher,
and the new teacher's fidelity, from a published model's stand-in."""

from __future__ import annotations

import logging
import re
import warnings

import pytest
import torch

import radio_lit
from benchmarks import adapt_drift
from benchmarks.adapt_drift import Drift, Row
from tests.published_stand_in import radio_stand_in

LAST_LINE = re.compile(
    r"drift with itself as teacher / without: (\S+) \(goal <= 0\.5\); "
    r"new-teacher fidelity ratio: (\S+) \(goal >= 0\.9\)"
)


def _row(seed: int, variant: str, summary: float, features: float, fidelity: float) -> Row:
    return Row(seed, variant, Drift(summary, 0.9, features, 0.9), fidelity, 1.0)


def test_the_ratios_are_the_drift_and_the_fidelity_of_b_over_a():
    """R: (b)'s normalized MSE over (a)'s, summary and features each averaged over seeds, then
    added; F: (b)'s mean fidelity over (a)'s."""
    rows = [
        _row(0, "without", 0.4, 0.2, 4.0),
        _row(1, "without", 0.6, 0.4, 6.0),
        _row(0, "with", 0.1, 0.05, 3.0),
        _row(1, "with", 0.1, 0.05, 6.0),
    ]
    r, f = adapt_drift.ratios(rows)
    assert r == pytest.approx((0.1 + 0.05) / (0.5 + 0.3))
    assert f == pytest.approx(4.5 / 5.0)


@pytest.mark.slow
def test_a_model_has_no_drift_from_itself_and_some_from_another():
    start = radio_lit.load(radio_stand_in())
    views = adapt_drift.photograph_views(128, 64)
    assert views.shape == (50, 3, 64, 64) and 0 <= float(views.min()) <= float(views.max()) <= 1
    same = adapt_drift.drift(start, start, views)
    assert same.summary_nmse == 0 and same.features_nmse == 0
    assert same.summary_cosine == pytest.approx(1) and same.features_cosine == pytest.approx(1)
    other = radio_lit.load(radio_stand_in())
    with torch.no_grad():
        for p in other.base_model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    moved = adapt_drift.drift(other, start, views)
    assert moved.features_nmse > 0 and moved.features_cosine < 1


@pytest.mark.slow
def test_the_benchmark_prints_its_table_and_last_line(tmp_path, capsys, monkeypatch):
    for name in ("lightning.pytorch", "lightning.fabric"):
        monkeypatch.setattr(logging.getLogger(name), "level", logging.getLogger(name).level)
    start = radio_stand_in()
    argv = ["--start", str(start), "--steps", "2", "--seeds", "0", "--workdir", str(tmp_path)]
    with warnings.catch_warnings():  # the script ignores warnings: not for later tests
        assert adapt_drift.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.lstrip().startswith("seed"))
    rows = [line.split() for line in lines[header + 1 : header + 3]]
    assert [r[:2] for r in rows] == [["0", "without"], ["0", "with"]]
    for row in rows:
        summary, s_cos, features, f_cos, fidelity = (float(v) for v in row[2:7])
        assert summary >= 0 and features >= 0 and -1 <= s_cos <= 1 and -1 <= f_cos <= 1
        assert fidelity > 0
    found = LAST_LINE.fullmatch(lines[-1])
    assert found, lines[-1]
    assert float(found.group(1)) >= 0 and float(found.group(2)) > 0
