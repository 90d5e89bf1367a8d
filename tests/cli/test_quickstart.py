"""The quickstart runs end to end through `radio-lit fit` and then seeds a second stage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from radio_lit.cli.app import RadioLitCLI

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")
STAGE = {"validate": "val", "test": "test", "predict": "predict"}  # Trainer.limit_<stage>_batches


def fit(tmp_path: Path, *overrides: str) -> RadioLitCLI:
    return RadioLitCLI(
        args=[
            "fit",
            "--config",
            QUICKSTART,
            "--trainer.logger.init_args.save_dir",
            str(tmp_path),
            "--trainer.default_root_dir",
            str(tmp_path),
            *overrides,
        ]
    )


def callbacks_without_measures() -> str:
    """The quickstart's callbacks less its evaluation measures (``radio_lit.evaluation``),
    as a ``--trainer.callbacks`` value. The measures, run at the end of fit, have a quickstart
    test of their own (tests/evaluation/test_in_training.py)."""
    callbacks = yaml.safe_load(Path(QUICKSTART).read_text())["trainer"]["callbacks"]
    kept = [c for c in callbacks if not c["class_path"].startswith("radio_lit.evaluation.")]
    assert len(kept) < len(callbacks)
    return json.dumps(kept)


@pytest.mark.slow
def test_quickstart_trains_logs_and_checkpoints(tmp_path):
    cli = fit(
        tmp_path, "--trainer.max_steps", "25", "--trainer.callbacks", callbacks_without_measures()
    )
    run_dir = Path(cli.trainer.logger.log_dir)
    assert (run_dir / "config.yaml").is_file()
    checkpoints = sorted((run_dir / "checkpoints").glob("*.ckpt"))
    assert [p.name for p in checkpoints] == ["last.ckpt"]
    state = torch.load(checkpoints[0], weights_only=True)
    assert state["global_step"] == 25
    assert not any(k.startswith("teachers.") for k in state["state_dict"])
    assert any(k.startswith("normalizers.clip.") for k in state["state_dict"])

    events = EventAccumulator(str(run_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for teacher in ("clip", "dino", "sam"):
        assert f"train/{teacher}/feature_loss" in tags
        assert f"stats/{teacher}/alpha" in tags
    assert {"train/clip/summary_loss", "train/dino/summary_loss", "train/loss"} <= tags
    assert "train/sam/summary_loss" not in tags
    assert {"lr/trunk_decay", "lr/heads_no_decay", "train/images_per_sec"} <= tags
    assert "stats/sam/eigenvalues" in events.Tags()["histograms"]
    for teacher in ("clip", "dino", "sam"):
        values = [e.value for e in events.Scalars(f"train/{teacher}/feature_loss")]
        assert values[-1] < values[0], f"{teacher} feature loss did not fall: {values}"


@pytest.fixture(scope="module")
def stage1(tmp_path_factory) -> RadioLitCLI:
    """A 2-step quickstart fit with statistics estimated over both steps and a last
    checkpoint (no evaluation measures: they have tests of their own); shared by the tests
    that only read its checkpoint."""
    return fit(
        tmp_path_factory.mktemp("stage1"),
        "--trainer.max_steps",
        "2",
        "--trainer.callbacks",
        "[{class_path: radio_lit.callbacks.TeacherStatsEstimation, init_args: {steps: 2}},"
        " {class_path: lightning.pytorch.callbacks.ModelCheckpoint, init_args: {save_last: true}}]",
    )


def last_checkpoint(cli: RadioLitCLI) -> Path:
    return Path(cli.trainer.logger.log_dir) / "checkpoints" / "last.ckpt"


@pytest.mark.slow
def test_a_second_stage_starts_from_the_first_stage_checkpoint(stage1):
    stage2 = RadioLitCLI(
        args=[
            "--config",
            QUICKSTART,
            "--model.init_from",
            str(last_checkpoint(stage1)),
            "--model.student_resolution",
            "96",
        ],
        run=False,
    )
    assert all(n.count.item() > 0 for n in stage1.model.normalizers.values())
    for key, value in stage1.model.student.state_dict().items():
        assert torch.equal(stage2.model.student.state_dict()[key], value), key
    assert all(n.count.item() == 0 for n in stage2.model.normalizers.values())


@pytest.mark.slow
@pytest.mark.parametrize(
    "normalizer",
    ["Identity", "GlobalStandardize", "Standardize", "PhiS", "PCAWhiten", "ZCAWhiten", "HCAWhiten"],
)
def test_quickstart_trains_with_every_normalizer(normalizer, tmp_path):
    """One ``--model.normalizer`` flag swaps the normalizer of every teacher, and the
    quickstart trains with it."""
    cli = fit(
        tmp_path,
        "--trainer.max_steps",
        "3",
        "--model.normalizer",
        f"radio_lit.normalizers.{normalizer}",
        # Statistics only: the evaluation callbacks and checkpoints have tests of their own.
        "--trainer.callbacks",
        "[{class_path: radio_lit.callbacks.TeacherStatsEstimation, init_args: {steps: 2}}]",
        "--trainer.enable_checkpointing",
        "false",
        "--trainer.check_val_every_n_epoch",
        "null",
    )
    metrics = cli.trainer.callback_metrics
    assert cli.trainer.global_step == 3
    assert torch.isfinite(metrics["train/loss"])
    for teacher in ("clip", "dino", "sam"):
        assert torch.isfinite(metrics[f"train/{teacher}/feature_loss"])
        assert type(cli.model.normalizers[teacher]).__name__ == normalizer


@pytest.mark.slow
@pytest.mark.parametrize("subcommand", ["validate", "test", "predict"])
def test_evaluation_subcommands_run_on_a_trained_checkpoint(subcommand, stage1, tmp_path):
    checkpoint = last_checkpoint(stage1)
    cli = RadioLitCLI(
        args=[
            subcommand,
            "--config",
            QUICKSTART,
            "--trainer.logger.init_args.save_dir",
            str(tmp_path / subcommand),
            "--ckpt_path",
            str(checkpoint),
            # the evaluation measures have tests of their own (tests/evaluation/)
            "--trainer.callbacks",
            callbacks_without_measures(),
            f"--trainer.limit_{STAGE[subcommand]}_batches=2",
        ]
    )
    if subcommand == "predict":
        estimates = cli.trainer.predict_loop.predictions[0]
        assert estimates["sam"].summary is None
        assert estimates["clip"].features.shape[-1] == cli.model.teachers["clip"].feature_dim
    else:
        assert torch.isfinite(cli.trainer.callback_metrics[f"{STAGE[subcommand]}/loss"])
