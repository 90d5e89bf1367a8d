"""Small-scale reproduction of the PHI-S ablations: ``radio-lit ablate`` (PHI-S section 3).

:mod:`~radio_lit.ablation.rows` lists the rows of PHI-S tables 1 and 12 (one override config
each in ``configs/ablations/``), :mod:`~radio_lit.ablation.runner` trains them through the
real CLI, :class:`FinalValidation` saves each row's final validation metrics, and
:mod:`~radio_lit.ablation.tables` lays them out as PHI-S tables 3, 5 and 18 plus mean ranks.
"""

from radio_lit.ablation.final_validation import FinalValidation
from radio_lit.ablation.rows import ROWS, Row, resolve_rows
from radio_lit.ablation.tables import TABLES, MetricTable, Table, all_tables, ordinal_ranks

__all__ = [
    "ROWS",
    "TABLES",
    "FinalValidation",
    "MetricTable",
    "Row",
    "Table",
    "all_tables",
    "ordinal_ranks",
    "resolve_rows",
]
