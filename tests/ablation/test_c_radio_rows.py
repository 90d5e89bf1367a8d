"""radio-lit ablate --row-set c-radio: C-RADIOv4's training parts, one row each, on teachers
with fixed-pattern noise (configs/ablations/c-radio/)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from radio_lit.ablation import C_RADIO_ROWS, ROW_SETS, runner
from radio_lit.ablation.rows import resolve_rows, slug
from radio_lit.cli.app import RadioLitCLI, main
from radio_lit.evaluation import FixedPatternProbe
from radio_lit.losses import MSE, AngleBalanced, Cosine
from radio_lit.normalizers import PhiS
from radio_lit.students.ema import EMAStudent
from radio_lit.teachers import FixedPatternTeacher

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "configs" / "ablations" / "c-radio"
BASE = str(FOLDER / "base.yaml")

# What each row adds to RADIOv2.5's losses (report 2.3.1, 2.5, 2.3.2 + 2.4).
PARTS = {
    "v2.5": (False, Cosine, False),
    "shift-equivariant": (True, Cosine, False),
    "shift-angle": (True, AngleBalanced, False),
    "shift-angle-mesa-damp": (True, AngleBalanced, True),
    "v2.5-random-cpe-windows": (False, Cosine, False),
}


def test_the_rows_are_exactly_the_override_files_and_resolve_by_name():
    assert {p.stem for p in FOLDER.glob("*.yaml")} - {"base"} == set(PARTS)
    assert [slug(name) for name in C_RADIO_ROWS] == list(PARTS)
    rows = resolve_rows(["shift + angle", "V2.5"], FOLDER, C_RADIO_ROWS)
    assert [r.name for r in rows] == ["Shift + Angle", "v2.5"]
    assert ROW_SETS["c-radio"].directory() == FOLDER
    assert ROW_SETS["phi-s"].directory() == FOLDER.parent


@pytest.fixture(scope="module")
def full_row() -> RadioLitCLI:
    """The last row (every part), built: one CLI for all tests (building is the slow part)."""
    row = str(FOLDER / "shift-angle-mesa-damp.yaml")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["radio-lit"])
        return RadioLitCLI(
            args=["--config", BASE, "--config", row, "--trainer.logger", "false"], run=False
        )


def test_the_full_row_builds_every_part_on_patterned_teachers(full_row):
    model = full_row.model
    assert all(isinstance(t, FixedPatternTeacher) for t in model.teachers.values())
    kinds = {name: t.kind for name, t in model.teachers.items()}
    assert kinds == {"siglip2": "border", "dino_v3": "speckle", "sam": "windows"}
    assert all(t.grid_size == (8, 8) for t in model.teachers.values())
    assert all(isinstance(n, PhiS) for n in model.normalizers.values())
    assert isinstance(model.feature_loss, MSE)
    assert isinstance(model.summary_loss, AngleBalanced)
    assert model.summary_loss.dispersion == {"dino_v3": 2.186}  # report table 3; SigLIP2 estimated
    assert isinstance(model.ema, EMAStudent)  # MESA's EMA student (shifts, DAMP: parsed below)
    assert any(isinstance(c, FixedPatternProbe) for c in full_row.trainer.callbacks)


@pytest.mark.parametrize("row", sorted(PARTS))
def test_each_row_adds_its_parts_to_the_v25_losses(full_row, row):
    config = full_row.parser.parse_args(["--config", BASE, "--config", str(FOLDER / f"{row}.yaml")])
    model = config.model
    shifts, summary_loss, mesa_damp = PARTS[row]
    assert model.normalizer.class_path == "radio_lit.normalizers.PhiS"
    assert model.loss.class_path == "radio_lit.losses.MSE"
    assert model.summary_loss.class_path == f"radio_lit.losses.{summary_loss.__name__}"
    # every row views the crop's centre (margin 0.25); the shifted rows shift (RADIO #181)
    assert model.shifts.class_path == "radio_lit.geometry.shifts.PatchShifts"
    assert model.shifts.init_args.margin == 0.25
    assert model.shifts.init_args.std == (0.5 if shifts else 0.0)
    assert (model.mesa is not None) == (model.damp is not None) == mesa_damp
    if mesa_damp:
        assert model.mesa.class_path == "radio_lit.students.ema.MESA"
        assert model.damp.class_path == "radio_lit.students.damp.DAMP"
    cpe = config.model.student.init_args
    whole_grid = row != "v2.5-random-cpe-windows"  # the base: the whole CPE grid every step
    assert (cpe.cpe_min_scale == cpe.cpe_max_aspect == 1.0) == whole_grid
    data = config.data.init_args
    assert 10 * data.repeats // data.batch_size == config.trainer.max_steps  # one epoch


def test_the_row_set_picks_its_rows_base_and_output(monkeypatch, tmp_path):
    calls = []
    monkeypatch.setattr(runner, "run_ablation", lambda *args: calls.append(args) or [])
    main(["ablate", "--row-set", "c-radio", "--rows", "shift + angle", "v2.5"])
    rows, base, overrides, out, seeds, cache, _, row_set = calls[0]
    assert [r.config for r in rows] == [FOLDER / "shift-angle.yaml", FOLDER / "v2.5.yaml"]
    assert (base, out, cache, row_set.name) == (
        FOLDER / "base.yaml",
        Path(row_set.out),
        None,
        "c-radio",
    )
    main(["ablate", "--rows", "PHI-S"])  # the default set is still PHI-S's
    assert calls[1][1] == FOLDER.parent / "base.yaml" and calls[1][3] == Path("runs/ablations")


def test_its_tables_are_the_pattern_tables_in_row_order(tmp_path):
    finished = {
        slug(name): {
            "row": name,
            "seconds": 1.0,
            "step": 3,
            "metrics": {"val/sam/pattern_share": 0.9 - 0.2 * k, "val/sam/clean_mse": 0.5},
        }
        for k, name in reversed(list(enumerate(C_RADIO_ROWS)))
    }
    runner._write_tables(finished, tmp_path, ROW_SETS["c-radio"])
    table = (tmp_path / "pattern_share.md").read_text()
    lines = [line for line in table.splitlines() if line.startswith("| ") and "Method" not in line]
    assert [line.split(" | ")[0][2:] for line in lines] == list(C_RADIO_ROWS)
    assert "| v2.5 | 0.9 |" in table
    assert (tmp_path / "clean_mse.md").is_file() and not (tmp_path / "ranks.md").exists()


def test_bad_rows_and_a_cache_are_one_clear_error(capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main(["ablate", "--row-set", "c-radio", "--rows", "MSE", "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    assert "the rows are v2.5, Shift-equivariant" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "ablate",
                "--row-set",
                "c-radio",
                "--cache",
                str(tmp_path / "c"),
                "--out",
                str(tmp_path),
            ]
        )
    assert exit_info.value.code == 2
    assert "--cache: the c-radio rows shift the teachers' views" in capsys.readouterr().err
    assert not (tmp_path / "rows").exists()
