"""Every config in configs/ablations/ builds on the base; rows are the paper's (that each
trains: tests/configs/test_shipped_steps.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

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
from tests.configs.shipped import built, raw

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "configs" / "ablations"

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


def test_the_rows_are_exactly_the_override_files():
    files = {p.stem for p in CONFIGS.glob("*.yaml")} - {"base"}
    assert files == set(PAPER_ROWS)


def test_the_base_has_four_table7_teachers_and_validates():
    config = raw("ablations/base.yaml")
    teachers = config["model"]["teachers"]
    presets = {name: t["init_args"]["statistics"] for name, t in teachers.items()}
    assert presets == {
        "dfn_clip": "dfn_clip",
        "siglip": "siglip",
        "dino_v2": "dinov2",
        "sam": "sam",
    }
    assert all(t["class_path"] == "radio_lit.teachers.RescaledTeacher" for t in teachers.values())
    assert all(stats in TABLE7 for stats in presets.values())
    data = config["data"]["init_args"]
    assert data["val_dir"] == "radio_lit:sample_images"
    # One epoch is the whole run, so its end is the one validation.
    assert 10 * data["repeats"] // data["batch_size"] == config["trainer"]["max_steps"]
    assert config["trainer"]["check_val_every_n_epoch"] == 1


@pytest.mark.parametrize("row", sorted(PAPER_ROWS))
def test_each_row_builds_the_papers_setting(row):
    """Each row built by the CLI (shared with tests/configs/, where it also takes a step)."""
    model = built(f"ablations/{row}.yaml").model
    normalizer, loss, balancer = PAPER_ROWS[row]
    assert {type(n) for n in model.normalizers.values()} == {normalizer}
    assert type(model.feature_loss) is loss
    assert type(model.balancer) is balancer
    if loss in (HybridMSE, HybridSmoothL1):
        assert model.feature_loss.beta == 0.9
    assert all(isinstance(t, RescaledTeacher) for t in model.teachers.values())
