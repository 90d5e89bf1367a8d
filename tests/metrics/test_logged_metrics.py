"""A validation / test run logs every metric tag per teacher, as the README lists them."""

from __future__ import annotations

import pytest

from tests.builders import cpu_trainer, image_batches, tiny_module

PER_TEACHER = ("mse", "fidelity", "error_variance_range", "error_variance_range_teacher")


def test_validate_and_test_log_the_metric_tags(tmp_path):
    module = tiny_module()  # Identity normalizers: the teacher space is the normalized space
    trainer = cpu_trainer(tmp_path)
    for stage, run in (("val", trainer.validate), ("test", trainer.test)):
        logged = run(module, image_batches(6, 2), verbose=False)[0]
        expected = {f"{stage}/{t}/{m}" for t in ("clip", "dino", "sam") for m in PER_TEACHER}
        expected |= {f"{stage}/clip/summary_cosine", f"{stage}/dino/summary_cosine"}
        assert expected | {f"{stage}/fidelity_geomean"} <= set(logged)
        assert f"{stage}/sam/summary_cosine" not in logged
        for teacher in ("clip", "dino", "sam"):
            # Equal batches: the set's MSE is the mean of the batches' feature losses.
            assert logged[f"{stage}/{teacher}/mse"] == pytest.approx(
                logged[f"{stage}/{teacher}/feature_loss"], rel=1e-5
            )
        assert logged[f"{stage}/clip/summary_cosine"] == pytest.approx(
            1 - logged[f"{stage}/clip/summary_loss"], rel=1e-5
        )
        assert trainer.callback_metrics[f"{stage}/fidelity_geomean"] > 0
