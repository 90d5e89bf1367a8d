"""The measures as callbacks: periodic runs in fit, a run at the end of test, the quickstart's
TensorBoard, and ``radio-lit evaluate`` on a checkpoint."""

from __future__ import annotations

from pathlib import Path

import pytest
from lightning.pytorch.loggers import TensorBoardLogger
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from radio_lit.cli.app import RadioLitCLI
from radio_lit.cli.evaluate import evaluate
from radio_lit.evaluation import PCAFeatureImages, RankMe
from tests.builders import cpu_trainer, image_batches, tiny_module

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")


def events(run_dir: Path) -> EventAccumulator:
    accumulator = EventAccumulator(str(run_dir), size_guidance={"images": 0, "scalars": 0})
    accumulator.Reload()
    return accumulator


@pytest.mark.slow
def test_measures_run_every_n_steps_and_at_the_end_of_test(tmp_path):
    logger = TensorBoardLogger(tmp_path, name="run")
    callbacks = [
        RankMe(per_class=1, crop_size=32, every_n_steps=1),
        PCAFeatureImages(num_images=1, crop_size=64, display=32, every_n_steps=1),
    ]
    trainer = cpu_trainer(tmp_path, max_steps=2, logger=logger, callbacks=callbacks)
    module = tiny_module()
    trainer.fit(module, image_batches(num_images=4, batch_size=2))
    trainer.test(module, image_batches(num_images=2, batch_size=2))
    logged = events(Path(logger.log_dir))
    steps = [e.step for e in logged.Scalars("eval/rankme/backbone/summary")]
    assert steps == [1, 2, 2]  # after steps 1 and 2 (not again at the end of fit), and test
    images = logged.Tags()["images"]
    assert {"eval/pca/0/input", "eval/pca/0/backbone", "eval/pca/0/clip", "eval/pca/0/sam"} <= set(
        images
    )


@pytest.mark.slow
def test_quickstart_shows_every_measure_and_evaluate_prints_a_table(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sys.argv", ["radio-lit"])
    cli = RadioLitCLI(
        args=[
            "fit",
            "--config",
            QUICKSTART,
            "--trainer.logger.init_args.save_dir",
            str(tmp_path),
            "--trainer.max_steps",
            "2",
        ]
    )
    run_dir = Path(cli.trainer.logger.log_dir)
    # fit ends with its results: a row per measure, a column per output (radio_lit.cli.results)
    table = capsys.readouterr().out.split("results at step 2\n", 1)[1].split("\n\n", 1)[0]
    columns = table.splitlines()[0].split()
    results = {line.split()[0]: line.split()[1:] for line in table.splitlines()[1:]}
    assert columns == ["backbone", "clip", "dino", "sam"]
    assert {"eval/zero_shot/top1", "eval/segmentation/miou_64"} <= set(results)
    logged = events(run_dir)
    scalars = set(logged.Tags()["scalars"])
    for tag in (
        "eval/knn/backbone/top1",
        "eval/knn/clip/top1",
        "eval/knn/clip/teacher_top1",
        "eval/zero_shot/clip/top1",
        "eval/zero_shot/clip/top5",
        "eval/zero_shot/clip/agreement",
        "eval/mode_switching/dino/jump_resolution",
        "eval/mode_switching/sam/mse/step_2",
        "eval/scale_equivariance/backbone/fine",
        "eval/scale_equivariance/backbone/coarse",
        "eval/rankme/backbone/summary",
        "eval/rankme/dino/features",
        "eval/segmentation/backbone/miou_64",
    ):
        assert tag in scalars, tag
    curve = [e.step for e in logged.Scalars("eval/mode_switching/dino/mse/step_2")]
    assert curve == [32, 64, 96, 128, 192]  # the x axis is the student resolution
    assert "eval/pca/0/dino" in logged.Tags()["images"]
    assert "eval/mode_switching/clip/text_summary" in logged.Tags()["tensors"]
    knn = logged.Scalars("eval/knn/backbone/top1")[-1].value
    assert 10.0 < knn <= 100.0  # ten photographs: chance is 10%
    assert results["eval/knn/top1"][columns.index("backbone")] == f"{knn:.4g}"

    preset = tmp_path / "rankme.yaml"
    preset.write_text(
        "trainer:\n  callbacks+:\n    - class_path: radio_lit.evaluation.RankMe\n"
        "      init_args: {crop_size: 64, per_class: 2}\n"
    )
    capsys.readouterr()
    rows = evaluate(
        ["--ckpt_path", str(run_dir / "checkpoints" / "last.ckpt"), "--config", str(preset)]
    )
    printed = capsys.readouterr().out
    assert [tag for tag, _ in rows][:2] == [
        "eval/rankme/backbone/features",
        "eval/rankme/backbone/summary",
    ]
    assert "(step 2)" in printed
    for tag, value in rows:
        assert tag in printed and value > 0
