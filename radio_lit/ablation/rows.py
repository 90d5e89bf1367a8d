"""The ablation rows and their override configs, by row set (``radio-lit ablate --row-set``).

- ``phi-s`` (the default): the rows of PHI-S tables 1 and 12 (``configs/ablations/``), each a
  small YAML file that sets ``model.normalizer``, ``model.loss`` and ``model.balancer``;
- ``c-radio``: C-RADIOv4's training parts added one by one to RADIOv2.5's losses
  (``configs/ablations/c-radio/``), on toy teachers with fixed-pattern noise; then a student
  above SigLIP2's native grid against its map shrunk onto or upsampled by FeatSharp, whose
  upsampler is a :class:`Prerequisite` the runner trains first.

A row's file name is its name in lower case with every run of other characters than letters,
digits and dots replaced by one hyphen (``"Hyb SmL1"`` -> ``hyb-sml1.yaml``,
``"Shift + Angle"`` -> ``shift-angle.yaml``); each folder holds its set's ``base.yaml``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from radio_lit.ablation.tables import C_RADIO_TABLES, TABLES, MetricTable

__all__ = [
    "C_RADIO_ROWS",
    "ROWS",
    "ROW_SETS",
    "Prerequisite",
    "Row",
    "RowSet",
    "default_rows_dir",
    "resolve_rows",
    "slug",
]

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

#: C-RADIOv4's training parts (report 2.3-2.5), each row adding one to the row before; then
#: the first row with CPEViT's random position-embedding windows (AM-RADIO 4) [choice]; then
#: a 256 px student against SigLIP2's 8x8 map shrunk onto (radio-lit before FeatSharp) or
#: upsampled 2x by FeatSharp (report 2.2), both on the v2.5 losses [choice].
C_RADIO_ROWS: tuple[str, ...] = (
    "v2.5",
    "Shift-equivariant",
    "Shift + Angle",
    "Shift + Angle + MESA/DAMP",
    "v2.5, random CPE windows",
    "High-res, shrunk",
    "High-res, FeatSharp 2x",
)


@dataclass(frozen=True)
class Prerequisite:
    """A run some rows need before they start, such as the FeatSharp upsampler of their
    teacher: ``radio-lit ablate`` trains it once per seed (with that seed's
    ``seed_everything``, the rows' overrides left out) into ``OUT/tensorboard/<name>``
    (``<name>-seed<k>`` for seed ``k``) and passes its last checkpoint to each of ``rows``
    with ``option``; a finished one (its checkpoint there) is not trained again.

    Attributes:
        name: its run's name, for folders and progress lines.
        config: its config, relative to ``configs/``.
        option: the rows' option that takes the checkpoint's path.
        rows: the names of the rows that need it.
    """

    name: str
    config: str
    option: str
    rows: tuple[str, ...]

    def path(self) -> Path:
        """The config file in the source tree (or the cwd's)."""
        return default_rows_dir().parent / self.config

    def run_name(self, seed: int) -> str:
        """Its run's folder name under ``OUT/tensorboard`` for ``seed``."""
        return self.name if seed == 0 else f"{self.name}-seed{seed}"

    def checkpoint(self, out: Path, seed: int) -> Path:
        """Its last checkpoint for ``seed`` under the ablation's output folder ``out``
        (Lightning's ``ModelCheckpoint(save_last=True)`` in its TensorBoard run folder)."""
        return out / "tensorboard" / self.run_name(seed) / "checkpoints" / "last.ckpt"


#: The upsampler of the c-radio rows' SigLIP2 (``configs/featsharp/ablation-c-radio.yaml``),
#: for both High-res rows: the FeatSharp row upsamples with it, the shrunk row takes its
#: teacher weights only, so that both distil the same random SigLIP2 [choice].
C_RADIO_UPSAMPLER = Prerequisite(
    "upsampler",
    "featsharp/ablation-c-radio.yaml",
    "--model.teachers.siglip2.init_args.checkpoint",
    ("High-res, shrunk", "High-res, FeatSharp 2x"),
)


@dataclass(frozen=True)
class Row:
    """One ablation row: its display name, file-system name and override config."""

    name: str
    slug: str
    config: Path


@dataclass(frozen=True)
class RowSet:
    """A set of rows: their names in table order, their folder, and their tables.

    Attributes:
        name: the ``--row-set`` value.
        rows: the row names, in the order of the tables.
        folder: the folder of the base and row configs, under ``configs/ablations``.
        tables: the per-teacher metric tables written for it.
        ranks: whether a mean-rank table is written too.
        cacheable: whether the rows may train from a teacher-feature cache (``--cache``):
            not when they shift the teachers' views each step, which a cache of unshifted
            views cannot hold.
        title: what the rows reproduce, for ``--help``.
        out: the default output folder of ``radio-lit ablate``.
        prerequisites: the runs some rows need first.
    """

    name: str
    rows: tuple[str, ...]
    folder: str
    tables: tuple[MetricTable, ...]
    ranks: bool
    cacheable: bool
    title: str
    out: str
    prerequisites: tuple[Prerequisite, ...] = ()

    def directory(self) -> Path:
        """The folder of this set's configs in the source tree (or the cwd's)."""
        return default_rows_dir() / self.folder


ROW_SETS: dict[str, RowSet] = {
    "phi-s": RowSet(
        "phi-s", ROWS, "", TABLES, True, True, "PHI-S tables 1 and 12", "runs/ablations"
    ),
    "c-radio": RowSet(
        "c-radio",
        C_RADIO_ROWS,
        "c-radio",
        C_RADIO_TABLES,
        False,
        False,
        "C-RADIOv4's training parts on teachers with fixed-pattern noise",
        "runs/ablations-c-radio",
        (C_RADIO_UPSAMPLER,),
    ),
}


def slug(name: str) -> str:
    """File-system name of a row: lower case, other runs of characters than letters, digits
    and dots as one hyphen."""
    return re.sub(r"[^a-z0-9.]+", "-", name.strip().lower()).strip("-")


def default_rows_dir() -> Path:
    """``configs/ablations`` of the source tree this package lives in, else of the cwd."""
    beside_package = Path(__file__).resolve().parents[2] / "configs" / "ablations"
    return beside_package if beside_package.is_dir() else Path("configs") / "ablations"


def resolve_rows(names: list[str], rows_dir: Path, known_rows: tuple[str, ...] = ROWS) -> list[Row]:
    """Rows for ``names`` among ``known_rows`` (the PHI-S rows by default): their names or file
    names, any case; or paths to YAML files.

    Raises:
        ValueError: naming every unknown row and listing the known ones, or a known row
            whose config file is missing from ``rows_dir``.
    """
    known = {slug(name): name for name in known_rows}
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
            f"unknown ablation row(s) {unknown}; the rows are {', '.join(known_rows)} (any case, "
            "spaces or hyphens), or paths to override YAML files"
        )
    missing = [str(row.config) for row in rows if not row.config.is_file()]
    if missing:
        raise ValueError(f"row config(s) not found: {missing}; point --rows-dir at them")
    seen: set[str] = set()
    return [row for row in rows if not (row.slug in seen or seen.add(row.slug))]
