"""The card of a real ``radio-lit fit`` run's mid-run checkpoint: the values TensorBoard holds
for that checkpoint's weights, whichever step Lightning logged them at (a validation after
step ``S`` is logged at ``S - 1``, a measure at ``S``), none of a later step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from radio_lit.cli.app import main
from radio_lit.export.logged import metric_name

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")
KNN = "eval/knn/backbone/top1"
CALLBACKS = [
    {"class_path": "radio_lit.callbacks.TeacherStatsEstimation", "init_args": {"steps": 1}},
    {
        "class_path": "lightning.pytorch.callbacks.ModelCheckpoint",
        "init_args": {"save_last": True, "save_top_k": -1, "every_n_train_steps": 2},
    },
    {
        "class_path": "radio_lit.evaluation.KNNClassification",
        "init_args": {"crop_size": 32, "per_class": 1, "every_n_steps": 2},
    },
]


@pytest.mark.slow
def test_a_mid_run_checkpoint_of_a_real_run_has_its_own_numbers(tmp_path: Path, capsys) -> None:
    overrides = {
        "trainer": {
            "max_steps": 4,
            "check_val_every_n_epoch": None,
            "val_check_interval": 2,
            "enable_model_summary": False,
            "callbacks": CALLBACKS,
        },
        "data": {"init_args": {"repeats": 2, "batch_size": 2, "crop_size": 64}},
    }
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(overrides))
    logger = ["--trainer.logger.init_args.save_dir", str(tmp_path)]
    logger += ["--trainer.logger.init_args.name", "tiny"]
    main(["fit", "--config", QUICKSTART, "--config", str(config), *logger])
    (run,) = (tmp_path / "tiny").glob("version_0*")  # named for its overlay (radio_lit.cli.runs)
    events = EventAccumulator(str(run))
    events.Reload()
    logged = {t: {e.step: e.value for e in events.Scalars(t)} for t in ("val/loss", KNN)}
    assert list(logged["val/loss"]) == [1, 3] and list(logged[KNN]) == [2, 4]

    checkpoint = run / "checkpoints" / "epoch=0-step=2.ckpt"
    capsys.readouterr()
    main(["export", str(checkpoint), "--format", "hf"])
    folder = run / "export" / "epoch=0-step=2-hf"
    card = (folder / "README.md").read_text()
    assert "\n# tiny\n" in card and "saved at optimizer step 2" in card
    rows = {  # metric name -> (value, step of the weights measured)
        cells[0]: (cells[1].split(" ")[0], cells[2])
        for cells in (line.strip("| ").split(" | ") for line in card.splitlines())
        if len(cells) == 5 and cells[4].startswith("`")
    }
    assert rows[metric_name("val/loss")] == (f"{logged['val/loss'][1]:.4g}", "2")  # logged at 1
    assert rows[metric_name(KNN)] == (f"{logged[KNN][2]:.4g}", "2")
    source = json.loads((folder / "config.json").read_text())["radio"]["radio_lit"]["source"]
    assert source["step"] == 2 and source["weights"] == "raw"
