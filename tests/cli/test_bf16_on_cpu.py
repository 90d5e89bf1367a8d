"""``precision: bf16-mixed`` on a CPU (docs/own-images.md's setting, run without a GPU) trains:
the half-precision maps are resampled in float32 where PyTorch's CPU kernels have no bfloat16
version (:func:`radio_lit.data.views.resize_view`), and the run's losses stay finite."""

from __future__ import annotations

import math

import pytest
import torch

from tests.cli.test_quickstart import callbacks_without_measures, fit


@pytest.mark.slow
def test_a_bf16_mixed_quickstart_steps_on_a_cpu(tmp_path):
    cli = fit(
        tmp_path,
        "--trainer.accelerator",
        "cpu",
        "--trainer.precision",
        "bf16-mixed",
        "--trainer.max_steps",
        "2",
        "--trainer.callbacks",
        callbacks_without_measures(),
    )
    assert cli.trainer.precision == "bf16-mixed"
    assert cli.trainer.global_step == 2
    loss = float(cli.trainer.callback_metrics["train/loss"])
    assert math.isfinite(loss) and loss > 0
    assert all(torch.isfinite(p).all() for p in cli.model.student.parameters())
