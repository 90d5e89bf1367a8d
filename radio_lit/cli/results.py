"""The results ``radio-lit fit`` prints at its end: its last validation and evaluation values.

TensorBoard holds every value at every step; the console ends with the last ones in one
compact table, an output (the backbone, or a teacher's head) per column and a measure per row:

```
results at step 300
                          backbone   clip    dino    sam
val/fidelity                     -    3.3   5.034  7.634
eval/knn/top1                 87.5  83.75      85      -
eval/segmentation/miou_64    29.58      -       -      -
val/fidelity_geomean         5.024
```

Validation values are the last validation epoch's (``trainer.callback_metrics``: ``val/<teacher>/
<metric>`` for :data:`VALIDATION_METRICS`, and ``val/fidelity_geomean``); evaluation values are
the last report of each :class:`~radio_lit.evaluation.base.Evaluation` callback
(``eval/<measure>/<output>/<metric>``; curves stay in TensorBoard).
"""

from __future__ import annotations

from collections.abc import Mapping

import lightning.pytorch as pl

from radio_lit.evaluation.base import Evaluation

#: ``[choice]`` the per-teacher validation metrics shown (docs/first-run.md): the
#: ones the papers report; the losses and error-variance ranges stay in TensorBoard.
VALIDATION_METRICS = ("fidelity", "mse", "summary_cosine")
#: Validation values of the whole run.
RUN_METRICS = ("val/fidelity_geomean",)


def evaluation_results(trainer: pl.Trainer) -> dict[str, float]:
    """``{tag: value}``: the last validation epoch's metrics and each evaluation callback's
    last scalars (rank 0's, which are every rank's: both are reduced across ranks)."""
    results: dict[str, float] = {}
    for tag, value in trainer.callback_metrics.items():
        parts = tag.split("/")
        shown = tag in RUN_METRICS or (
            len(parts) == 3 and parts[0] == "val" and parts[2] in VALIDATION_METRICS
        )
        if shown:
            results[tag] = float(value)
    for callback in trainer.callbacks:  # type: ignore[attr-defined]
        if isinstance(callback, Evaluation) and callback.last_report is not None:
            results.update({tag: float(v) for tag, v in callback.last_report.scalars.items()})
    return results


def results_table(results: Mapping[str, float], step: int) -> str:
    """``results`` as a table: ``val/<teacher>/<metric>`` and ``eval/<measure>/<output>/
    <metric>`` as rows ``val/<metric>``, ``eval/<measure>/<metric>`` with a column per teacher
    or output; other tags as ``tag  value`` lines below. ``""`` when there is nothing."""
    if not results:
        return ""
    cells: dict[str, dict[str, float]] = {}
    single: dict[str, float] = {}
    for tag, value in results.items():
        parts = tag.split("/")
        if parts[0] == "val" and len(parts) == 3:
            cells.setdefault(f"val/{parts[2]}", {})[parts[1]] = value
        elif parts[0] == "eval" and len(parts) == 4:
            cells.setdefault(f"eval/{parts[1]}/{parts[3]}", {})[parts[2]] = value
        else:
            single[tag] = value
    columns = sorted({c for row in cells.values() for c in row}, key=_column_order)
    rows = sorted(cells, key=lambda r: (not r.startswith("val/"), r))
    width = max(len(tag) for tag in [*cells, *single])
    text = {r: {c: f"{v:.4g}" for c, v in cells[r].items()} for r in rows}
    widths = {c: max([len(c)] + [len(text[r].get(c, "-")) for r in rows]) for c in columns}
    lines = [f"results at step {step}"]
    if rows:
        lines.append(" " * width + "".join(f"  {c:>{widths[c]}}" for c in columns))
        for row in rows:
            values = "".join(f"  {text[row].get(c, '-'):>{widths[c]}}" for c in columns)
            lines.append(f"{row:<{width}}{values}")
    lines += [f"{tag:<{width}}  {value:.4g}" for tag, value in sorted(single.items())]
    return "\n".join(lines)


def _column_order(column: str) -> tuple[bool, str]:
    """The backbone first, then the teachers by name."""
    return column != "backbone", column
