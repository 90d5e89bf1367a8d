"""The ablation tables and mean ranks, against hand-made metric values."""

from __future__ import annotations

import csv

import pytest

from radio_lit.ablation.tables import all_tables, ordinal_ranks, teachers_of, write_csv


def _metrics(mse: tuple[float, float], fidelity: tuple[float, float], geomean: float) -> dict:
    values = {"val/loss": 1.0, "val/fidelity_geomean": geomean}
    for teacher, m, f in zip(("clip", "sam"), mse, fidelity, strict=True):
        values[f"val/{teacher}/mse"] = m
        values[f"val/{teacher}/fidelity"] = f
        values[f"val/{teacher}/error_variance_range"] = m / 2
        values[f"val/{teacher}/error_variance_range_teacher"] = m * 3
    return values


# Three rows; by hand: MSE ranks clip (A 3, B 1, C 2), sam (A 1, B 2.5, C 2.5: a tie).
RESULTS = {
    "A": _metrics(mse=(0.3, 1.0), fidelity=(1.1, 3.0), geomean=1.816),
    "B": _metrics(mse=(0.1, 2.0), fidelity=(1.3, 2.0), geomean=1.612),
    "C": _metrics(mse=(0.2, 2.0), fidelity=(1.2, 2.5), geomean=1.732),
}


def test_ranks_put_the_best_first_and_share_ties():
    assert ordinal_ranks([0.3, 0.1, 0.2], higher_is_better=False) == [3, 1, 2]
    assert ordinal_ranks([0.3, 0.1, 0.2], higher_is_better=True) == [1, 3, 2]
    assert ordinal_ranks([1.0, 2.0, 2.0, None], higher_is_better=False) == [1, 2.5, 2.5, None]
    assert ordinal_ranks([5.0, 5.0, 5.0], higher_is_better=True) == [2, 2, 2]


def test_teacher_tables_and_mean_ranks():
    assert teachers_of(RESULTS) == ["clip", "sam"]
    tables = all_tables(RESULTS)
    assert list(tables) == [
        "teacher_mse",
        "fidelity",
        "error_variance_range",
        "error_variance_range_teacher",
        "ranks",
    ]
    assert tables["teacher_mse"].rows[1] == ("B", [0.1, 2.0])
    assert tables["fidelity"].header == ["Method", "clip", "sam", "GeoMean"]
    assert tables["fidelity"].rows[0] == ("A", [1.1, 3.0, 1.816])
    ranks = dict(tables["ranks"].rows)
    # MSE: A (3 + 1) / 2 = 2, B (1 + 2.5) / 2 = 1.75, C (2 + 2.5) / 2 = 2.25; the error
    # variance ranges are proportional to the MSE here, so they rank the same.
    # Fidelity is ranked by its geometric mean (higher is better): A 1, C 2, B 3.
    assert ranks["A"] == pytest.approx([2.0, 1.0, 2.0, 2.0, 1.75])
    assert ranks["B"] == pytest.approx([1.75, 3.0, 1.75, 1.75, 2.0625])
    assert ranks["C"] == pytest.approx([2.25, 2.0, 2.25, 2.25, 2.1875])


def test_markdown_and_csv(tmp_path):
    results = dict(RESULTS)
    results["D"] = {"val/loss": 2.0}  # a run that logged no teacher metric
    tables = all_tables(results)
    text = tables["teacher_mse"].markdown()
    assert "| Method | clip | sam |" in text
    assert "| A | 0.3 | 1 |" in text
    assert "| D | - | - |" in text
    assert dict(tables["ranks"].rows)["D"] == [None, None, None, None, None]

    write_csv(tmp_path / "results.csv", results)
    with (tmp_path / "results.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [r["row"] for r in rows] == ["A", "B", "C", "D"]
    assert float(rows[1]["val/sam/mse"]) == 2.0
    assert rows[3]["val/sam/mse"] == ""
