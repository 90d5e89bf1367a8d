"""The imported heads' optimizer moments across refits: what a refit does to
the imported heads' loss terms, with and without forgetting the composed layer's moments.

Each refit of the statistics during estimation (``TeacherStatsEstimation``) composes every
imported head with the new normalizer (:mod:`radio_lit.export.head_spaces`): its last layer is
rotated and rescaled into the new normalized space. AdamW's moments of that layer were gathered
in the old space; ``ImportedHeads.follow`` forgets them [choice]. This runs the adapt twin
(``configs/recipes/adapt/quickstart.yaml``, from the tiny stand-in of its starting file,
:func:`tests.published_stand_in.radio_stand_in`: random weights, the quickstart's architecture)
for ``--steps`` steps, logging every step, twice:

- **reset**: as shipped (the composed layer's moments forgotten at each refit);
- **kept**: the moments kept across refits (``optimizer_of`` patched to ``None``, so
  ``follow`` composes the weights only).

Printed per variant: each imported head's loss terms (``train/<teacher>/<term>``) at every
step, and the largest step-to-step rise of a term over the run (a flat run: small).

    python benchmarks/refit_moments.py            # ~5 min on the shared 2-core CPU
"""

from __future__ import annotations

import argparse
import csv
import sys
import tempfile
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ADAPT = ROOT / "configs" / "recipes" / "adapt" / "quickstart.yaml"
HEADS = ("clip", "dino", "sam")


def run(variant: str, steps: int, start: Path, folder: Path) -> dict[int, dict[str, float]]:
    """The adapt twin for ``steps`` steps from ``start``; ``{step: {metric: value}}``."""
    import radio_lit.module
    from radio_lit.cli.app import main

    config = folder / "adapt.yaml"
    config.write_text(ADAPT.read_text().replace("published/quickstart.pth", str(start)))
    argv = [
        "radio-lit", "fit", "--config", str(config),
        f"--trainer.max_steps={steps}", "--trainer.log_every_n_steps=1",
        "--trainer.logger=lightning.pytorch.loggers.CSVLogger",
        f"--trainer.logger.save_dir={folder}", "--trainer.logger.name=" + variant,
    ]  # fmt: skip
    forget = radio_lit.module.optimizer_of if variant == "reset" else (lambda _: None)
    with (
        mock.patch.object(sys, "argv", argv),
        mock.patch.object(radio_lit.module, "optimizer_of", forget),
    ):
        try:
            main()
        except SystemExit as exit_:
            if exit_.code not in (0, None):
                raise
    rows = {}
    with next((folder / variant).rglob("metrics.csv")).open() as file:
        for row in csv.DictReader(file):
            values = {k: float(v) for k, v in row.items() if v not in ("", None) and k != "step"}
            rows.setdefault(int(row["step"]), {}).update(values)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=40)
    args = parser.parse_args()
    from tests.published_stand_in import radio_stand_in

    start = radio_stand_in(HEADS)
    results = {}
    for variant in ("reset", "kept"):
        with tempfile.TemporaryDirectory() as folder:
            results[variant] = run(variant, args.steps, start, Path(folder))
    rows = results["reset"]
    logged = {k for r in rows.values() for k in r}
    keys = sorted(k for k in logged if any(k.startswith(f"train/{h}/") for h in HEADS))
    for variant, rows in results.items():
        print(f"== {variant}")
        print("step " + " ".join(k.removeprefix("train/") for k in keys))
        for step in sorted(rows):
            present = [rows[step].get(k) for k in keys]
            if any(v is not None for v in present):
                print(f"{step:4d} " + " ".join("-" if v is None else f"{v:.4g}" for v in present))
    for variant, rows in results.items():
        rises = []
        for key in keys:
            series = [rows[s][key] for s in sorted(rows) if key in rows[s]]
            if len(series) > 1:
                rises.append(max(b - a for a, b in zip(series, series[1:], strict=False)))
        print(f"{variant}: largest step-to-step rise of an imported term: {max(rises):.4g}")


if __name__ == "__main__":
    main()
