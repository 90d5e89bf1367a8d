"""What a run says while it trains: schedule warnings at its start, one-line progress when the
output is not a terminal, and (through the real command) where its checkpoint is."""

from __future__ import annotations

import logging

from radio_lit.callbacks import FreezeBody, TeacherStatsEstimation
from radio_lit.callbacks.progress import LineProgress
from radio_lit.callbacks.schedule import ScheduleCheck
from tests.builders import cpu_trainer, image_batches, tiny_module


def test_a_short_run_is_warned_and_reports_its_progress(tmp_path, capsys, caplog):
    """Two steps of 2-batch epochs, against 3 estimation steps, 5 frozen steps, a 10-step
    warm-up and validation every 5 epochs (step 10): four warnings, then progress lines."""
    trainer = cpu_trainer(
        tmp_path,
        max_steps=2,
        check_val_every_n_epoch=5,
        enable_progress_bar=True,
        callbacks=[
            TeacherStatsEstimation(steps=3),
            FreezeBody(steps=5),
            ScheduleCheck(),
            LineProgress(interval_s=1e-6),
        ],
    )
    with caplog.at_level(logging.WARNING, logger="radio_lit.callbacks.schedule"):
        trainer.fit(tiny_module(warmup_steps=10), image_batches(8, 4), image_batches(4, 4))
    said = [r.getMessage() for r in caplog.records if "trainer.max_steps=2" in r.getMessage()]
    assert len(said) == 4, said
    assert any("statistics estimation does (TeacherStatsEstimation.steps=3)" in s for s in said)
    assert any("frozen trunk does (FreezeBody.steps=5)" in s for s in said)
    assert any("warm-up does (model.warmup_steps=10)" in s for s in said)
    assert any("validation first runs after 10 steps" in s for s in said)
    lines = capsys.readouterr().out.splitlines()
    assert [line.split("  ")[0] for line in lines] == ["step 1/2 (50%)", "step 2/2 (100%)"]
    assert "it/s" in lines[0] and "left" in lines[0]


def test_a_schedule_that_fits_is_not_warned(tmp_path, caplog):
    trainer = cpu_trainer(
        tmp_path, max_steps=4, callbacks=[TeacherStatsEstimation(steps=2), ScheduleCheck()]
    )
    with caplog.at_level(logging.WARNING, logger="radio_lit.callbacks.schedule"):
        trainer.fit(tiny_module(warmup_steps=1), image_batches(8, 4), image_batches(4, 4))
    assert not [r for r in caplog.records if "max_steps" in r.getMessage()]
