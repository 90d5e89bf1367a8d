"""Every config in configs/ablations/ parses with the base and trains; rows are the paper's."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from radio_lit.callbacks import TeacherStatsEstimation
from radio_lit.cli import RadioLitCLI
from radio_lit.losses import MSE, AdaLoss, Cosine, HybridMSE, HybridSmoothL1, Weighted
from radio_lit.normalizers import (
    GlobalStandardize,
    HCAWhiten,
    Identity,
    PCAWhiten,
    PhiS,
    Standardize,
    ZCAWhiten,
)
from radio_lit.teachers import TABLE7, RescaledTeacher
from tests.builders import cpu_trainer

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "ablations"
BASE = str(CONFIGS / "base.yaml")

# PHI-S section 2 and A.9.1: the normalizer, feature loss and balancer of each row of
# tables 1 and 12 (baselines on raw features, beta = 0.9 for the hybrids as in AM-RADIO).
PAPER_ROWS = {
    "mse": (Identity, MSE, Weighted),
    "cosine": (Identity, Cosine, Weighted),
    "hyb-mse": (Identity, HybridMSE, Weighted),
    "hyb-sml1": (Identity, HybridSmoothL1, Weighted),
    "global-stdze": (GlobalStandardize, MSE, Weighted),
    "standardize": (Standardize, MSE, Weighted),
    "phi-s": (PhiS, MSE, Weighted),
    "pca-w": (PCAWhiten, MSE, Weighted),
    "zca": (ZCAWhiten, MSE, Weighted),
    "hca": (HCAWhiten, MSE, Weighted),
    "ada-mse": (Identity, MSE, AdaLoss),
    "ada-phi-s": (PhiS, MSE, AdaLoss),
}


@pytest.fixture(scope="module")
def parser():
    """One LightningCLI parser for all rows (building it is the slow part of the CLI)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["radio-lit"])  # as `radio-lit` with nothing more
        return RadioLitCLI(args=["--config", BASE, "--trainer.logger", "false"], run=False).parser


def test_the_rows_are_exactly_the_override_files():
    files = {p.stem for p in CONFIGS.glob("*.yaml")} - {"base"}
    assert files == set(PAPER_ROWS)


def test_the_base_has_four_table7_teachers_and_validates(parser):
    config = parser.parse_args(["--config", BASE])
    teachers = config.model.teachers
    presets = {name: t.init_args.statistics for name, t in teachers.items()}
    assert presets == {
        "dfn_clip": "dfn_clip",
        "siglip": "siglip",
        "dino_v2": "dinov2",
        "sam": "sam",
    }
    assert all(t.class_path == "radio_lit.teachers.RescaledTeacher" for t in teachers.values())
    assert all(stats in TABLE7 for stats in presets.values())
    assert config.data.init_args.val_dir == "radio_lit:sample_images"
    # One epoch is the whole run, so its end is the one validation.
    data = config.data.init_args
    assert 10 * data.repeats // data.batch_size == config.trainer.max_steps
    assert config.trainer.check_val_every_n_epoch == 1


@pytest.mark.parametrize("row", sorted(PAPER_ROWS))
def test_each_row_builds_the_papers_setting_and_trains(parser, row, tmp_path):
    config = parser.parse_args(["--config", BASE, "--config", str(CONFIGS / f"{row}.yaml")])
    objects = parser.instantiate_classes(config)
    model, data = objects.model, objects.data
    normalizer, loss, balancer = PAPER_ROWS[row]
    assert {type(n) for n in model.normalizers.values()} == {normalizer}
    assert type(model.feature_loss) is loss
    assert type(model.balancer) is balancer
    if loss in (HybridMSE, HybridSmoothL1):
        assert model.feature_loss.beta == 0.9
    assert all(isinstance(t, RescaledTeacher) for t in model.teachers.values())

    trainer = cpu_trainer(
        tmp_path, max_steps=2, callbacks=[TeacherStatsEstimation(steps=2, refit_every=1)]
    )
    before = model.student.blocks[0].attn.qkv.weight.detach().clone()
    trainer.fit(model, data)
    assert trainer.global_step == 2
    assert math.isfinite(float(trainer.callback_metrics["train/loss"]))
    assert not torch.equal(before, model.student.blocks[0].attn.qkv.weight)
