"""The rows of PHI-S tables 1 and 12 and their override configs (``configs/ablations/``).

Every row is one small YAML file that sets ``model.normalizer``, ``model.loss`` and
``model.balancer`` on top of a base config; its file name is the row's name in lower case with
spaces replaced by hyphens (``"Hyb SmL1"`` -> ``hyb-sml1.yaml``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["ROWS", "Row", "default_rows_dir", "resolve_rows", "slug"]

#: PHI-S tables 1 and 12, in the paper's order: baselines, standardization, whitening, AdaLoss.
ROWS: tuple[str, ...] = (
    "MSE",
    "Cosine",
    "Hyb MSE",
    "Hyb SmL1",
    "Global Stdze",
    "Standardize",
    "PHI-S",
    "PCA-W",
    "ZCA",
    "HCA",
    "Ada-MSE",
    "Ada-PHI-S",
)


@dataclass(frozen=True)
class Row:
    """One ablation row: its display name, file-system name and override config."""

    name: str
    slug: str
    config: Path


def slug(name: str) -> str:
    """File-system name of a row: lower case, spaces and underscores as hyphens."""
    return name.strip().lower().replace(" ", "-").replace("_", "-")


def default_rows_dir() -> Path:
    """``configs/ablations`` of the source tree this package lives in, else of the cwd."""
    beside_package = Path(__file__).resolve().parents[2] / "configs" / "ablations"
    return beside_package if beside_package.is_dir() else Path("configs") / "ablations"


def resolve_rows(names: list[str], rows_dir: Path) -> list[Row]:
    """Rows for ``names`` (paper names or file names, any case; or paths to YAML files).

    Raises:
        ValueError: naming every unknown row and listing the known ones, or a known row
            whose config file is missing from ``rows_dir``.
    """
    known = {slug(name): name for name in ROWS}
    rows, unknown = [], []
    for given in names:
        path = Path(given)
        if path.suffix in (".yaml", ".yml") and path.is_file():
            rows.append(Row(path.stem, slug(path.stem), path))
        elif slug(given) in known:
            key = slug(given)
            rows.append(Row(known[key], key, rows_dir / f"{key}.yaml"))
        else:
            unknown.append(given)
    if unknown:
        raise ValueError(
            f"unknown ablation row(s) {unknown}; the rows are {', '.join(ROWS)} (any case, "
            "spaces or hyphens), or paths to override YAML files"
        )
    missing = [str(row.config) for row in rows if not row.config.is_file()]
    if missing:
        raise ValueError(f"row config(s) not found: {missing}; point --rows-dir at them")
    seen: set[str] = set()
    return [row for row in rows if not (row.slug in seen or seen.add(row.slug))]
