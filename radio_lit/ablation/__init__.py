"""Small-scale reproduction of the PHI-S ablations: ``radio-lit ablate`` (PHI-S section 3);
``--row-set c-radio``: C-RADIOv4's training parts on teachers with fixed-pattern noise.

:mod:`~radio_lit.ablation.rows` lists the rows of PHI-S tables 1 and 12 (one override config
each in ``configs/ablations/``), :mod:`~radio_lit.ablation.runner` trains them through the
real CLI, :class:`FinalValidation` saves each row's final validation metrics, and
:mod:`~radio_lit.ablation.tables` lays them out as PHI-S tables 3, 5 and 18 plus mean ranks.
"""

from radio_lit.ablation.final_validation import FinalValidation
from radio_lit.ablation.rows import C_RADIO_ROWS, ROW_SETS, ROWS, Row, RowSet, resolve_rows
from radio_lit.ablation.tables import TABLES, MetricTable, Table, all_tables, ordinal_ranks

__all__ = [
    "C_RADIO_ROWS",
    "ROWS",
    "ROW_SETS",
    "TABLES",
    "FinalValidation",
    "MetricTable",
    "Row",
    "RowSet",
    "Table",
    "all_tables",
    "ordinal_ranks",
    "resolve_rows",
]
