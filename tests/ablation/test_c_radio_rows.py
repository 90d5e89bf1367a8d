"""radio-lit ablate --row-set c-radio: C-RADIOv4's training parts, one row each, on teachers
with fixed-pattern noise (configs/ablations/c-radio/)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml

from radio_lit.ablation import C_RADIO_ROWS, ROW_SETS, runner
from radio_lit.ablation.rows import resolve_rows, slug
from radio_lit.cli.app import RadioLitCLI, main
from radio_lit.evaluation import FixedPatternProbe
from radio_lit.losses import MSE, AngleBalanced, Cosine
from radio_lit.normalizers import PhiS
from radio_lit.students.ema import EMAStudent
from radio_lit.teachers import FixedPatternTeacher
from radio_lit.upsamplers import UpsampledTeacher
from radio_lit.upsamplers.module import TEACHER_WEIGHTS, teacher_weights

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
    "high-res-shrunk": (False, Cosine, False),
    "high-res-featsharp-2x": (False, Cosine, False),
}
HIGH_RES = ("high-res-shrunk", "high-res-featsharp-2x")


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


# -- the High-res rows: SigLIP2's map shrunk onto or upsampled by FeatSharp --------------------
UPSAMPLER_CONFIG = ROOT / "configs" / "featsharp" / "ablation-c-radio.yaml"


def _overlay(path: Path, callbacks: list[dict], **data: int) -> str:
    """A config on top: 2 steps, no logger, ``callbacks``, ``data``'s ``init_args``."""
    trainer = {"max_steps": 2, "logger": False, "default_root_dir": str(path.parent)}
    config = {"trainer": {**trainer, "callbacks": callbacks}, "data": {"init_args": data}}
    path.write_text(yaml.safe_dump(config))
    return str(path)


def _statistics(steps: int) -> dict:
    init = {"steps": steps, "refit_every": 1, "log_spectrum": False}
    return {"class_path": "radio_lit.callbacks.TeacherStatsEstimation", "init_args": init}


@pytest.fixture(scope="module")
def upsampler_checkpoint(tmp_path_factory) -> Path:
    """configs/featsharp/ablation-c-radio.yaml (the rows' prerequisite) for 2 steps."""
    root = tmp_path_factory.mktemp("upsampler")
    saved = {"class_path": "lightning.pytorch.callbacks.ModelCheckpoint"}
    saved["init_args"] = {"dirpath": str(root), "save_last": True, "save_top_k": 0}
    overlay = _overlay(root / "short.yaml", [saved], repeats=1, batch_size=2)
    pre_pass = "--model.init_args.statistics_batches=1"  # the normalizer from one batch
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["radio-lit"])
        RadioLitCLI(args=["fit", "--config", str(UPSAMPLER_CONFIG), "--config", overlay, pre_pass])
    return root / "last.ckpt"


def _row(name: str, checkpoint: Path, tmp_path: Path) -> RadioLitCLI:
    """Row ``name`` with the upsampler ``checkpoint``: 2 steps, one epoch (validation and the
    probe at its end), statistics from the first step."""
    callbacks = [_statistics(1), {"class_path": "radio_lit.evaluation.FixedPatternProbe"}]
    overlay = _overlay(tmp_path / f"{name}.yaml", callbacks, repeats=2, batch_size=10)
    args = ["--config", BASE, "--config", str(FOLDER / f"{name}.yaml"), "--config", overlay]
    args += [f"--model.teachers.siglip2.init_args.checkpoint={checkpoint}"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["radio-lit"])
        return RadioLitCLI(args=args, run=False)


def test_the_high_res_rows_distil_one_siglip2_shrunk_or_upsampled(upsampler_checkpoint, tmp_path):
    """Both rows load the prerequisite's checkpoint: the same SigLIP2 (teacher weights and
    pattern scale); the FeatSharp row's targets are its 16x16 map for the 256 px student, the
    shrunk row's the 8x8 one; both train and are probed on SigLIP2's own 8x8 grid."""
    saved = torch.load(upsampler_checkpoint, weights_only=True)
    rows = {name: _row(name, upsampler_checkpoint, tmp_path) for name in HIGH_RES}
    for name, cli in rows.items():
        siglip2 = cli.model.teachers["siglip2"]
        assert isinstance(siglip2, UpsampledTeacher) and siglip2.factor == 2
        assert cli.model.student_resolution == (256, 256)
        upsampled = name == "high-res-featsharp-2x"
        assert siglip2.view_size((16, 16)) == ((256, 256) if upsampled else (128, 128))
        weights = teacher_weights(siglip2.teacher)  # FixedPatternTeacher: sigma + OpenCLIP
        assert weights.keys() == saved[TEACHER_WEIGHTS].keys()
        for key, value in saved[TEACHER_WEIGHTS].items():
            torch.testing.assert_close(weights[key], value, rtol=0, atol=0, msg=key)
        torch.testing.assert_close(
            siglip2.upsampler.bias.bias, saved["state_dict"]["upsampler.bias.bias"]
        )
        crops = torch.rand(2, 3, 256, 256)
        out = siglip2(crops, siglip2.view_size((16, 16)))
        assert out.features.shape == ((2, 16, 16, 96) if upsampled else (2, 8, 8, 96))
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
        assert cli.trainer.global_step == 2
        metrics = cli.trainer.callback_metrics
        assert torch.isfinite(metrics["train/loss"])
        assert {"val/siglip2/pattern_share", "val/siglip2/clean_mse"} <= set(metrics)


def test_a_high_res_row_without_its_upsampler_stops_in_one_line(capsys, tmp_path):
    missing = tmp_path / "upsampler" / "last.ckpt"
    row = str(FOLDER / "high-res-featsharp-2x.yaml")
    argv = ["fit", "--config", BASE, "--config", row]
    argv += ["--model.teachers.siglip2.init_args.checkpoint", str(missing)]
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert errors == [
        f"radio-lit: error: model.teachers.siglip2: init_args.checkpoint: no upsampler "
        f"checkpoint at {missing}; train it first with radio-lit fit --config "
        "configs/featsharp/ablation-c-radio.yaml (or give null for an untrained one)"
    ]


def test_the_runner_trains_the_upsampler_once_per_seed_for_both_rows(monkeypatch, tmp_path):
    """Before the High-res rows, ``radio-lit ablate`` trains their prerequisite once per seed
    into the output folder and hands its checkpoint to both; a trained one is kept; a failed
    one stops the ablation with its log."""
    prerequisite = ROW_SETS["c-radio"].prerequisites[0]
    started, exit_code = [], [0]

    class Finished:
        def __init__(self, command):
            self.exitcode = exit_code[0]
            args = command.args
            seed = (
                int(args[args.index("--seed_everything") + 1]) if "--seed_everything" in args else 0
            )
            if self.exitcode == 0:
                path = prerequisite.checkpoint(tmp_path, seed)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()

        def join(self):
            pass

    def fake_start(command, log, slot):
        started.append(command.args)
        return Finished(command)

    rows_run = []
    monkeypatch.setattr(runner, "start", fake_start)
    monkeypatch.setattr(
        runner._RowRunner,
        "run",
        lambda self: rows_run.append(self.commands) or [(0.0, None)] * len(self.rows),
    )
    rows = resolve_rows([*HIGH_RES, "v2.5"], FOLDER, C_RADIO_ROWS)
    row_set = ROW_SETS["c-radio"]
    runner.run_ablation(rows, Path(BASE), [], tmp_path, 2, None, None, row_set)
    assert [args[:3] for args in started] == [["fit", "--config", str(UPSAMPLER_CONFIG)]] * 2
    assert "--seed_everything" not in started[0] and started[1][3:5] == ["--seed_everything", "1"]
    option = "--model.teachers.siglip2.init_args.checkpoint"
    handed = [c.args[c.args.index(option) + 1] if option in c.args else None for c in rows_run[0]]
    seed0, seed1 = (str(prerequisite.checkpoint(tmp_path, seed)) for seed in (0, 1))
    assert handed == [seed0, seed1, seed0, seed1, None, None]  # rows x seeds, v2.5 needs none
    started.clear()
    runner.run_ablation(rows, Path(BASE), [], tmp_path, 3, None, None, row_set)
    assert len(started) == 1 and started[0][3:5] == ["--seed_everything", "2"]  # seed 2 only
    exit_code[0] = 1
    with pytest.raises(
        ValueError, match="upsampler-seed3 .*featsharp/ablation-c-radio.yaml.* failed"
    ):
        runner.run_ablation(rows, Path(BASE), [], tmp_path, 4, None, None, row_set)
