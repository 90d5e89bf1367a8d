"""The PHI-S ablation tables from the rows' final validation metrics.

Each row of an ablation (one loss / normalizer / balancer setting, PHI-S tables 1 and 12)
ends with a dict of validation metrics ``{"val/<teacher>/<metric>": value}`` (the tags of
:mod:`radio_lit.metrics`). This module lays them out as the paper does:

- teacher MSE per teacher, in each teacher's own space (PHI-S table 3; lower is better);
- fidelity per teacher and their geometric mean (PHI-S A.9.2 eq. 51, table 18; higher);
- the range of the per-channel error variances, in the normalized space and denormalized to
  the teacher's space (PHI-S 4.1, table 5; lower);
- each row's mean ordinal rank over the teachers of each of these tables (for fidelity: the
  rank of the geometric mean), and their average (the "Teacher MSE" column of PHI-S tables 1
  and 12 is such a mean rank; 1 is best).

Missing values (a metric a run did not log) are shown as ``-`` and left out of the ranks.

The C-RADIOv4 rows (``--row-set c-radio``) get :data:`C_RADIO_TABLES` instead: the share of
the teachers' fixed pattern the student reproduces and its error against the clean teacher
features (:class:`~radio_lit.metrics.PatternShare`), then teacher MSE and fidelity.
"""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "C_RADIO_TABLES",
    "TABLES",
    "MetricTable",
    "Table",
    "mean_ranks",
    "ordinal_ranks",
    "rank_table",
    "teachers_of",
    "write_csv",
]

Metrics = Mapping[str, float]


@dataclass(frozen=True)
class MetricTable:
    """One paper table: a per-teacher metric ``val/<teacher>/<metric>``.

    Attributes:
        key: short name (file name of the markdown table, rank column).
        title: heading, with the paper's table number.
        metric: the tag's last part.
        higher_is_better: direction of the ranking.
        summary: optional tag of an across-teacher column (e.g. the fidelity geometric mean),
            shown last and not ranked.
    """

    key: str
    title: str
    metric: str
    higher_is_better: bool = False
    summary: str | None = None


TABLES: tuple[MetricTable, ...] = (
    MetricTable(
        "teacher_mse", "Teacher MSE, teacher space (PHI-S table 3; lower is better)", "mse"
    ),
    MetricTable(
        "fidelity",
        "Fidelity Var[Y] / MSE(X, Y) (PHI-S table 18; higher is better)",
        "fidelity",
        higher_is_better=True,
        summary="val/fidelity_geomean",
    ),
    MetricTable(
        "error_variance_range",
        "Range of per-channel error variances, normalized space (PHI-S table 5; lower is better)",
        "error_variance_range",
    ),
    MetricTable(
        "error_variance_range_teacher",
        "Range of per-channel error variances, teacher space (PHI-S table 5; lower is better)",
        "error_variance_range_teacher",
    ),
)


#: The C-RADIOv4 rows (``--row-set c-radio``): how much of the teachers' fixed pattern the
#: student reproduces (:class:`~radio_lit.evaluation.FixedPatternProbe`), then PHI-S's MSE and
#: fidelity.
C_RADIO_TABLES: tuple[MetricTable, ...] = (
    MetricTable(
        "pattern_share",
        "Share of the teachers' fixed pattern the student reproduces (1: all of it; lower is "
        "better)",
        "pattern_share",
    ),
    MetricTable(
        "clean_mse",
        "MSE against the teachers' features without the pattern, teacher space (lower is better)",
        "clean_mse",
    ),
    *TABLES[:2],
)


@dataclass(frozen=True)
class Table:
    """A rendered table: a header and rows of cells (``None`` for a missing value).

    With several seeds, ``spreads`` holds each cell's standard deviation over the seeds (the
    cells are then means) and ``higher_is_better`` the direction of the columns: a cell whose
    mean lies within the seeds' spread of its column's best (``|m - m_best| <= s + s_best``)
    is marked ``≈``, a difference the seeds do not resolve.
    """

    title: str
    header: list[str]
    rows: list[tuple[str, list[float | None]]]
    spreads: list[list[float | None]] | None = None
    higher_is_better: bool = False

    def markdown(self) -> str:
        """GitHub-flavoured markdown, values with 4 significant digits (± 2 for spreads)."""
        lines = [
            f"| {' | '.join(self.header)} |",
            "|" + "|".join(["---"] + ["---:"] * (len(self.header) - 1)) + "|",
        ]
        ties = self._ties()
        for r, (name, values) in enumerate(self.rows):
            cells = []
            for c, v in enumerate(values):
                cell = "-" if v is None else f"{v:.4g}"
                if v is not None and self.spreads is not None:
                    spread = self.spreads[r][c]
                    cell += "" if spread is None else f" ± {spread:.2g}"
                    cell += " ≈" if (r, c) in ties else ""
                cells.append(cell)
            lines.append(f"| {' | '.join([name, *cells])} |")
        note = ""
        if self.spreads is not None:
            note = (
                "\nMean ± standard deviation over the seeds; ≈: within the seeds' spread of "
                "the column's best (not a resolved difference).\n"
            )
        return f"### {self.title}\n\n" + "\n".join(lines) + "\n" + note

    def _ties(self) -> set[tuple[int, int]]:
        """Cells (row, column) within the seeds' spread of their column's best, best excluded."""
        if self.spreads is None or not self.rows:
            return set()
        ties = set()
        for c in range(len(self.rows[0][1])):
            cells = [
                (values[c], self.spreads[r][c] or 0.0, r)
                for r, (_, values) in enumerate(self.rows)
                if values[c] is not None and not math.isnan(values[c])
            ]
            if not cells:
                continue
            best = (max if self.higher_is_better else min)(cells, key=lambda cell: cell[0])
            for value, spread, r in cells:
                if r != best[2] and abs(value - best[0]) <= spread + best[1]:
                    ties.add((r, c))
        return ties


def teachers_of(results: Mapping[str, Metrics], prefix: str = "val/") -> list[str]:
    """Teacher names found in tags ``<prefix><teacher>/<metric>``, in first-seen order."""
    names: dict[str, None] = {}
    for metrics in results.values():
        for tag in metrics:
            parts = tag[len(prefix) :].split("/") if tag.startswith(prefix) else []
            if len(parts) == 2:
                names.setdefault(parts[0])
    return list(names)


def ordinal_ranks(values: Sequence[float | None], higher_is_better: bool) -> list[float | None]:
    """Rank 1 for the best value; ties share their average rank; ``None``/NaN stay unranked."""
    present = [(v, i) for i, v in enumerate(values) if v is not None and not math.isnan(v)]
    present.sort(key=lambda item: -item[0] if higher_is_better else item[0])
    ranks: list[float | None] = [None] * len(values)
    start = 0
    while start < len(present):
        end = start
        while end + 1 < len(present) and present[end + 1][0] == present[start][0]:
            end += 1
        for _, index in present[start : end + 1]:
            ranks[index] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def _mean(values: Sequence[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def metric_table(
    spec: MetricTable,
    results: Mapping[str, Metrics],
    teachers: Sequence[str],
    spreads: Mapping[str, Metrics] | None = None,
) -> Table:
    """The values of ``spec`` for every row (``results``: row name -> metrics; ``spreads``:
    row name -> each metric's standard deviation over seeds, when several were run)."""
    header = ["Method", *teachers] + (["GeoMean"] if spec.summary else [])
    tags = [f"val/{t}/{spec.metric}" for t in teachers] + ([spec.summary] if spec.summary else [])
    rows = [(name, [metrics.get(tag) for tag in tags]) for name, metrics in results.items()]
    cells = None
    if spreads is not None:
        cells = [[spreads.get(name, {}).get(tag) for tag in tags] for name in results]
    return Table(spec.title, header, rows, cells, spec.higher_is_better)


def mean_ranks(
    spec: MetricTable, results: Mapping[str, Metrics], teachers: Sequence[str]
) -> dict[str, float | None]:
    """Each row's rank among the rows, per teacher, averaged over the teachers.

    A table with an across-teacher ``summary`` column is ranked by that column instead: the
    fidelity of one teacher ranks the rows exactly as its MSE does (``Var[Y]`` is the same
    for every row), so the geometric mean is what fidelity adds.
    """
    names = list(results)
    if spec.summary is not None:
        values = [results[n].get(spec.summary) for n in names]
        return dict(zip(names, ordinal_ranks(values, spec.higher_is_better), strict=True))
    per_teacher = [
        ordinal_ranks(
            [results[n].get(f"val/{t}/{spec.metric}") for n in names], spec.higher_is_better
        )
        for t in teachers
    ]
    return {n: _mean([ranks[i] for ranks in per_teacher]) for i, n in enumerate(names)}


def rank_table(
    results: Mapping[str, Metrics],
    teachers: Sequence[str],
    specs: Sequence[MetricTable] = TABLES,
) -> Table:
    """Mean rank per table of ``specs`` (columns) and their average, for every row (1 is
    best)."""
    columns = {spec.key: mean_ranks(spec, results, teachers) for spec in specs}
    rows = []
    for name in results:
        values = [columns[spec.key][name] for spec in specs]
        rows.append((name, [*values, _mean(values)]))
    header = ["Method", *(spec.key for spec in specs), "Average"]
    return Table(
        "Mean rank across teachers, fidelity by its geometric mean (1 is best; PHI-S tables 1, 12)",
        header,
        rows,
    )


def all_tables(
    results: Mapping[str, Metrics],
    spreads: Mapping[str, Metrics] | None = None,
    specs: Sequence[MetricTable] = TABLES,
    ranks: bool = True,
) -> dict[str, Table]:
    """Every table of ``specs`` (PHI-S's :data:`TABLES` by default) plus, with ``ranks``, the
    rank table, keyed by file stem; with several seeds, ``results`` holds the means and
    ``spreads`` the standard deviations (the ranks are those of the means)."""
    teachers = teachers_of(results)
    tables = {spec.key: metric_table(spec, results, teachers, spreads) for spec in specs}
    if ranks:
        tables["ranks"] = rank_table(results, teachers, specs)
    return tables


def write_csv(path: Path, results: Mapping[str, Mapping[str, float | str]]) -> None:
    """One line per row, one column per metric (the union over rows, sorted)."""
    columns = sorted({tag for metrics in results.values() for tag in metrics})
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["row", *columns])
        for name, metrics in results.items():
            writer.writerow([name, *(metrics.get(c, "") for c in columns)])
