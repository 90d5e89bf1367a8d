"""FixedPatternProbe: val/<teacher>/pattern_share and clean_mse beside the validation metrics."""

from __future__ import annotations

import pytest
import torch

from radio_lit.callbacks import TeacherStatsEstimation
from radio_lit.core.errors import ConfigError
from radio_lit.evaluation import FixedPatternProbe
from radio_lit.teachers import FixedPatternTeacher
from tests.builders import cpu_trainer, image_batches, tiny_module
from tests.teachers.tiny import tiny_dinov2_teacher, tiny_sam_teacher


def test_the_probes_values_add_up_to_the_validation_mse(tmp_path):
    """For any student ``x`` and ``y = y_clean + P``: ``mse(x, y) = clean_mse + E_P - 2 share
    E_P`` (``E_P`` the pattern's mean square): the probe and the validation metrics, two
    separate code paths, see the same estimates, images, grid and teacher space."""
    torch.manual_seed(0)
    teachers = {
        "dino": FixedPatternTeacher(tiny_dinov2_teacher(), "speckle", calibration_views=1),
        "sam": FixedPatternTeacher(
            tiny_sam_teacher(resolution=64), "windows", window=2, seed=1, calibration_views=1
        ),
    }
    module = tiny_module(teachers=teachers)
    trainer = cpu_trainer(
        tmp_path,
        max_steps=2,
        callbacks=[TeacherStatsEstimation(steps=2, refit_every=1), FixedPatternProbe()],
    )
    trainer.fit(module, image_batches(), image_batches(seed=1))
    metrics = trainer.callback_metrics
    for name, teacher in teachers.items():
        share = float(metrics[f"val/{name}/pattern_share"])
        clean = float(metrics[f"val/{name}/clean_mse"])
        energy = teacher.pattern((4, 4)).double().square().mean().item()
        expected = clean + energy * (1 - 2 * share)
        assert float(metrics[f"val/{name}/mse"]) == pytest.approx(expected, rel=1e-4)
        assert clean > 0 and abs(share) < 1


def test_a_probe_without_a_patterned_teacher_is_one_clear_error():
    module = tiny_module()
    with pytest.raises(ConfigError, match="no teacher of this run carries a fixed pattern"):
        FixedPatternProbe().setup(None, module, "fit")
    module.teachers["dino"] = FixedPatternTeacher(module.teachers["dino"], calibration_views=1)
    with pytest.raises(ConfigError, match=r"names \['sam'\], which carry no fixed pattern"):
        FixedPatternProbe(teachers=["dino", "sam"]).setup(None, module, "fit")
