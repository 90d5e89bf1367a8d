"""radio-lit ablate --seeds N (mean ± std tables, unresolved differences marked) and
--cache DIR (the teachers' cache written once, every row and seed trained from it)."""

from __future__ import annotations

import json
from pathlib import Path

from radio_lit.ablation import runner
from radio_lit.ablation.rows import resolve_rows
from radio_lit.ablation.tables import MetricTable, metric_table
from tests.ablation.test_ablation_runner import fake_row

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "configs" / "ablations" / "base.yaml"
ROWS_DIR = ROOT / "configs" / "ablations"

#: Per row and seed, the fidelity each fake run reports.
FIDELITY = {("MSE", 0): 1.0, ("MSE", 1): 1.2, ("PHI-S", 0): 4.0, ("PHI-S", 1): 5.0}
FIDELITY |= {("ZCA", 0): 3.8, ("ZCA", 1): 4.0}


def _fake_fit(calls: list[tuple[str, list[str]]]):
    """A stand-in for a row's fit writing the files FinalValidation writes."""

    def command(row, base, overrides, out):
        calls.append((row.slug, list(overrides)))
        seed = (
            int(overrides[overrides.index("--seed_everything") + 1])
            if "--seed_everything" in overrides
            else 0
        )
        value = FIDELITY[(row.name, seed)]
        metrics = {
            "step": 3,
            "metrics": {"val/clip/fidelity": value, "val/fidelity_geomean": value},
        }
        path = out / "rows" / f"{row.slug}.metrics.json"
        args = [str(path), json.dumps(metrics), "0"]
        return runner.Command(f"{fake_row.__module__}:fake_row", args)

    return command


def test_seeds_and_cache(monkeypatch, tmp_path, capsys):
    calls: list[tuple[str, list[str]]] = []
    caches: list[Path] = []
    monkeypatch.setattr(runner, "_fit_command", _fake_fit(calls))
    monkeypatch.setattr(
        runner, "_write_cache", lambda base, o, folder, out, slots: caches.append(folder)
    )
    rows = resolve_rows(["MSE", "PHI-S", "ZCA"], ROWS_DIR)
    cache = tmp_path / "cache"
    assert runner.run_ablation(rows, BASE, [], tmp_path / "out", seeds=2, cache=cache) == []

    assert caches == [cache]  # once for every row and seed
    assert [slug for slug, _ in calls] == [
        "mse",
        "mse-seed1",
        "phi-s",
        "phi-s-seed1",
        "zca",
        "zca-seed1",
    ]
    assert calls[0][1] == ["--data", "radio_lit.cache.CachedViews", "--data.path", str(cache)]
    assert calls[1][1][:2] == ["--seed_everything", "1"]
    assert calls[1][1][-1] == str(cache)  # the teachers are the cache's for every seed

    fidelity = (tmp_path / "out" / "fidelity.md").read_text()
    assert "| MSE | 1.1 ± 0.14 | 1.1 ± 0.14 |" in fidelity
    assert "| PHI-S | 4.5 ± 0.71 | 4.5 ± 0.71 |" in fidelity  # the best
    assert "| ZCA | 3.9 ± 0.14 ≈ | 3.9 ± 0.14 ≈ |" in fidelity  # within the seeds' spread
    assert "within the seeds' spread" in capsys.readouterr().out


def test_single_seed_tables_are_unchanged():
    spec = MetricTable("fidelity", "Fidelity", "fidelity", higher_is_better=True)
    table = metric_table(spec, {"A": {"val/t/fidelity": 2.0}, "B": {"val/t/fidelity": 1.0}}, ["t"])
    assert table.markdown().splitlines()[-2:] == ["| A | 2 |", "| B | 1 |"]
