"""The model card of ``radio-lit export --format hf``, as a user publishes it: the numbers of
the exported checkpoint's own step (a mid-run checkpoint, EMA weights), a title and datasets
from the run, names a reader understands, chance-level results marked and kept out of the
model-index, the recipe's C-RADIOv4 parts, a citation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils.tensorboard import SummaryWriter

from radio_lit.cli.app import main
from radio_lit.evaluation.data import SAMPLE_CLASSES
from radio_lit.export.card import model_card
from radio_lit.export.logged import SAMPLE_CLASSES as CARD_SAMPLE_CLASSES
from radio_lit.export.logged import RunMeasures, metric_name
from tests.export.tiny_export import saved_run

KNN = "eval/knn/backbone/top1"
ZERO_SHOT = "eval/zero_shot/clip/top1"
#: What the run below logged: tag -> {logged step: value}. Validation is logged at the step
#: before the weights it measured (Lightning), the measures at their own step.
LOGGED = {
    "val/fidelity_geomean": {99: 2.0, 199: 3.0, 299: 4.0},
    KNN: {150: 61.25, 300: 72.5},
    ZERO_SHOT: {150: 10.0, 300: 11.25},  # 10 classes, 80 images: chance
    "eval/segmentation/backbone/miou_64": {300: 29.5},
}
CALLBACKS = [
    {"class_path": "radio_lit.evaluation.KNNClassification", "init_args": {"crop_size": 64}},
    {"class_path": "radio_lit.evaluation.ZeroShotClassification", "init_args": {"teacher": "clip"}},
    {
        "class_path": "radio_lit.evaluation.SegmentationProbe",
        "init_args": {"root": "/data/ade20k", "num_classes": 150},
    },
]
RUN = {
    "trainer": {
        "logger": {
            "class_path": "lightning.pytorch.loggers.TensorBoardLogger",
            "init_args": {"save_dir": "lightning_logs", "name": "tiny-radio"},
        },
        "callbacks": CALLBACKS,
    },
    "data": {
        "class_path": "radio_lit.data.ImageFolderDataModule",
        "init_args": {"train_dir": "/data/datacomp/train", "val_dir": "/data/datacomp/val"},
    },
    "model": {
        "shifts": {
            "class_path": "radio_lit.geometry.shifts.PatchShifts",
            "init_args": {"std": 0.5},
        },
        "damp": {"class_path": "radio_lit.students.damp.DAMP", "init_args": {"std": 0.1}},
        "mesa": {"class_path": "radio_lit.students.ema.MESA", "init_args": {"decay": 0.9996}},
        "summary_loss": {"class_path": "radio_lit.losses.AngleBalanced"},
    },
}


@pytest.fixture(scope="module")
def run(trained, tmp_path_factory) -> Path:
    """A run folder with TensorBoard events up to step 300, its last checkpoint (step 300,
    with EMA weights) and a mid-run one (``last-preempted.ckpt``, step 200)."""
    folder = tmp_path_factory.mktemp("runs") / "tiny-radio" / "version_0"
    saved_run(trained, folder, step=200, name="last-preempted.ckpt", config=RUN)
    last = saved_run(trained, folder, step=300, config=RUN)
    state = torch.load(last, weights_only=True)
    weights = state["state_dict"]
    for key in [k for k in weights if k.startswith(("student.", "heads."))]:
        value = weights[key]
        weights["ema." + key] = value + 0.25 if value.is_floating_point() else value
    torch.save(state, last)
    writer = SummaryWriter(str(folder))
    for tag, points in LOGGED.items():
        for step, value in points.items():
            writer.add_scalar(tag, value, step)
    writer.close()
    return folder


def export_card(checkpoint: Path, *options: str) -> tuple[dict, str, Path]:
    """``radio-lit export CHECKPOINT --format hf`` into its default folder: the card's front
    matter, its body, the folder."""
    main(["export", str(checkpoint), "--format", "hf", *options])
    stem = checkpoint.stem + ("-ema" if "--ema" in options else "")
    folder = checkpoint.parent.parent / "export" / f"{stem}-hf"
    _, front, body = (folder / "README.md").read_text().split("---\n", 2)
    return yaml.safe_load(front), body, folder


def test_a_mid_run_checkpoint_shows_its_own_steps_numbers(run: Path) -> None:
    """Step 200 of a run that went on to 300: the values logged for the weights of step 200
    or before, none of steps 300; no model-index, since no headline result measured these
    very weights."""
    meta, body, folder = export_card(run / "checkpoints" / "last-preempted.ckpt")
    assert "saved at optimizer step 200" in body and "optimizer steps: 200" in body
    assert "as trained (raw, not an EMA)" in body
    assert "| fidelity, geometric mean over the teachers | 3 | 200 |" in body  # logged at 199
    assert f"| {metric_name(KNN)} | 61.25 | 150 (earlier) |" in body
    for later in ("72.5", "| 4 |", "29.5", "11.25"):
        assert later not in body
    assert "model-index" not in meta
    source = json.loads((folder / "config.json").read_text())["radio"]["radio_lit"]["source"]
    assert source["step"] == 200 and source["weights"] == "raw"
    assert source["checkpoint"].endswith("last-preempted.ckpt")


def test_the_last_checkpoints_card_is_publishable(run: Path) -> None:
    """Title from the run, datasets as configured, Hub metric types with readable names, the
    chance-level zero-shot marked and left out, licence link, citation, radio-lit version."""
    meta, body, folder = export_card(run / "checkpoints" / "last.ckpt")
    assert body.lstrip("\n").startswith("# tiny-radio\n")
    (index,) = meta["model-index"]
    assert index["name"] == "tiny-radio"
    results = {r["metrics"][0]["name"]: r for r in index["results"]}
    assert set(results) == {metric_name(KNN), metric_name("eval/segmentation/backbone/miou_64")}
    knn = results[metric_name(KNN)]
    assert knn["metrics"][0] == {"type": "accuracy", "value": 72.5, "name": metric_name(KNN)}
    assert knn["dataset"]["name"] == SAMPLE_CLASSES  # KNNClassification's default eval_dir
    assert results[metric_name("eval/segmentation/backbone/miou_64")]["dataset"]["name"] == (
        "/data/ade20k"
    )
    assert f"| {metric_name(ZERO_SHOT)} | 11.25 (at chance: 10) | 300 |" in body
    assert "- training images: `/data/datacomp/train`" in body
    assert "as configured in the run" not in body
    assert meta["license"] == "other" and meta["license_link"] == "LICENSE.md"
    assert "| clip | radio-lit-tiny-clip (random) |" in (folder / "LICENSE.md").read_text()
    for paper in ("AM-RADIO", "2412.07679", "2410.01680", "2601.17237"):  # C-RADIOv4: used
        assert paper in body
    assert "Trained with radio-lit 0." in body and "https://github.com/" in body
    for part in ("shift-equivariant dense loss", "DAMP", "EMA student", "angle-balanced"):
        assert part in body


def test_an_ema_card_says_so_and_lists_no_raw_metrics(run: Path) -> None:
    meta, body, folder = export_card(run / "checkpoints" / "last.ckpt", "--ema")
    assert body.lstrip("\n").startswith("# tiny-radio-ema\n")
    assert "the **EMA**" in body and "decay 0.9996" in body
    assert "model-index" not in meta
    assert "72.5" not in body and "radio-lit evaluate --model_path" in body
    source = json.loads((folder / "config.json").read_text())["radio"]["radio_lit"]["source"]
    assert source == {
        "checkpoint": str(run / "checkpoints" / "last.ckpt"),
        "step": 300,
        "weights": "ema",
    }


def test_name_option_titles_the_card(run: Path, tmp_path: Path, capsys) -> None:
    checkpoint = run / "checkpoints" / "last.ckpt"
    main(["export", str(checkpoint), "--format", "hf", "--output", str(tmp_path / "out")])
    assert "\n# tiny-radio\n" in (tmp_path / "out" / "README.md").read_text()  # not "# out"
    main(
        ["export", str(checkpoint), "--format", "hf", "--name", "my-student"]
        + ["--output", str(tmp_path / "mine")]
    )
    assert "\n# my-student\n" in (tmp_path / "mine" / "README.md").read_text()
    with pytest.raises(SystemExit) as stopped:
        main(["export", str(checkpoint), "--name", "x", "--output", str(tmp_path / "x")])
    assert stopped.value.code == 2
    assert "--name: only --format hf" in capsys.readouterr().err


def test_chance_levels_and_sample_classes() -> None:
    """Top-1 of the 10 shipped photographs is 10 %, top-5 50 %; the threshold is three
    binomial standard errors over the 80 images (8 crops per photograph)."""
    assert CARD_SAMPLE_CLASSES == SAMPLE_CLASSES  # export does not import evaluation
    measures = RunMeasures({"trainer": {"callbacks": CALLBACKS}})
    chance, threshold = measures.chance(ZERO_SHOT)
    assert chance == pytest.approx(10.0)
    assert threshold == pytest.approx(100 * (0.1 + 3 * (0.1 * 0.9 / 80) ** 0.5))
    assert measures.chance("eval/zero_shot/clip/top5")[0] == pytest.approx(50.0)
    assert measures.chance("eval/segmentation/backbone/miou_64") is None
    assert RunMeasures({}).chance(KNN) is None  # no such callback: its data are unknown


def test_a_run_without_c_radio_parts_cites_the_three_papers(trained, tmp_path: Path) -> None:
    checkpoint = saved_run(trained, tmp_path / "run" / "version_0", step=10)
    main(["export", str(checkpoint), "--format", "hf"])
    card = (checkpoint.parent.parent / "export" / "last-hf" / "README.md").read_text()
    assert "\n# run\n" in card  # no logger in the config: the run folder's name
    assert "2601.17237" not in card and "C-RADIOv4's parts" not in card
    assert "2412.07679" in card and "2410.01680" in card
    assert "Not evaluated: the run logged no val/ or eval/ metrics at or before step 10" in card


def test_card_text_is_the_configs(trained) -> None:
    """ViTDet and partitions (stochastic resolution) as the config gives them."""
    config = {"radio_lit": {"preferred_resolution": [64, 64], "patch_size": 16}}
    config["radio_lit"].update(num_cls_tokens=1, num_registers=0, source={"step": 5})
    model = {
        "student": {"class_path": "x.CPEViT", "init_args": {"vitdet_window_sizes": [2]}},
        "partitions": {"low": {"resolutions": [48, 64], "batch_size": 6}},
    }
    card = model_card("m", {**config, "teachers": []}, {"model": model}, {})
    assert "ViTDet windowed attention in training: windows [2] tokens" in card
    assert "- partition low: resolutions [48, 64], batch 6, teachers all" in card
