"""An overlay config given alone says it is one and which full config to stack it on."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from radio_lit.cli.overlays import overlay_error

ROOT = Path(__file__).resolve().parents[2]
#: Every shipped YAML that sets no data: the overlays.
OVERLAYS = sorted(
    str(p.relative_to(ROOT))
    for folder in ("configs", "callbacks")
    for p in (ROOT / folder).rglob("*.yaml")
    if "data" not in (yaml.safe_load(p.read_text()) or {})
)
REQUIRED = "Option 'fit.data' is required but not provided or its value is None."


def test_the_overlays_are_the_ones_meant_to_be_stacked() -> None:
    assert "configs/quickstart-eradio.yaml" in OVERLAYS
    assert "configs/ablations/mse.yaml" in OVERLAYS and "callbacks/phi_s.yaml" in OVERLAYS
    assert "configs/quickstart.yaml" not in OVERLAYS


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_each_overlay_alone_names_a_full_config_that_sets_data(overlay, monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    message = overlay_error(REQUIRED, ["fit", "--config", overlay])
    assert message is not None and "\n" not in message
    assert message.startswith(f"fit.data: no --config sets data: {overlay} is an overlay")
    stacked = message.split("radio-lit fit ", 1)[1].split()
    base = stacked[1]
    assert stacked == ["--config", base, "--config", overlay]
    assert "data" in yaml.safe_load((ROOT / base).read_text())


def test_the_quickstart_overlay_names_its_base_and_a_full_stack_is_left_alone(
    monkeypatch,
) -> None:
    monkeypatch.chdir(ROOT)
    eradio = ["fit", "--config", "configs/quickstart-eradio.yaml"]
    assert overlay_error(REQUIRED, eradio).endswith(
        "radio-lit fit --config configs/quickstart.yaml --config configs/quickstart-eradio.yaml"
    )
    stacked = ["fit", "--config", "configs/quickstart.yaml", *eradio[1:]]
    assert overlay_error(REQUIRED, stacked) is None
    assert overlay_error("Option 'fit.data' is wrong", eradio) is None
    teachers = REQUIRED.replace("fit.data", "fit.model.teachers")
    assert "fit.model.teachers: no --config sets model.teachers" in overlay_error(teachers, eradio)


QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")


def _resolved(tmp_path, capsys, overlay: dict | list[dict], *flags: str) -> dict:
    """The config ``radio-lit fit --config configs/quickstart.yaml --config OVERLAY...
    FLAGS... --print_config`` prints."""
    from radio_lit.cli.app import main

    configs = ["--config", QUICKSTART]
    for i, layer in enumerate(overlay if isinstance(overlay, list) else [overlay]):
        path = tmp_path / f"overlay{i}.yaml"
        path.write_text(yaml.safe_dump(layer))
        configs += ["--config", str(path)]
    with pytest.raises(SystemExit) as stopped:
        main(["fit", *configs, *flags, "--print_config"])
    assert stopped.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def test_an_overlay_changing_one_teacher_keeps_the_others(tmp_path, capsys) -> None:
    overlay = {"model": {"teachers": {"dino": {"init_args": {"model_kwargs": {"depth": 1}}}}}}
    kwargs = {"depth": 1, "embed_dim": 48, "num_heads": 2, "img_size": 56}  # the rest kept
    model = _resolved(tmp_path, capsys, overlay, "--model.feature_weights.sam", "2")["model"]
    quickstart = yaml.safe_load(Path(QUICKSTART).read_text())["model"]["teachers"]
    assert list(model["teachers"]) == ["clip", "dino", "sam"]
    dino = model["teachers"]["dino"]
    assert dino["class_path"] == quickstart["dino"]["class_path"]
    assert dino["init_args"]["model_kwargs"] == kwargs
    assert dino["init_args"]["model"] == quickstart["dino"]["init_args"]["model"]
    assert model["teachers"]["clip"]["init_args"]["model_cfg"]["embed_dim"] == 32
    assert model["teachers"]["sam"]["init_args"]["resolution"] == 64
    assert model["feature_weights"] == {"sam": 2.0}


def test_an_overlay_removes_a_teacher_and_a_per_teacher_entry_by_null(tmp_path, capsys) -> None:
    """``sam: null`` removes sam (a JSON merge patch); per-teacher options merge the same way;
    a flag giving a whole mapping replaces it."""
    overlay = {
        "model": {
            "teachers": {"sam": None},
            "feature_weights": {"clip": 2.0, "dino": 3.0},
            "summary_weights": {"clip": 0.5},
        }
    }
    flags = ["--model.summary_weights.dino", "2", "--model.feature_weights", "{clip: 4.0}"]
    model = _resolved(tmp_path, capsys, overlay, *flags)["model"]
    assert list(model["teachers"]) == ["clip", "dino"]
    assert model["feature_weights"] == {"clip": 4.0}
    assert model["summary_weights"] == {"clip": 0.5, "dino": 2.0}


def test_a_later_overlay_changes_one_partition_and_keeps_the_other(tmp_path, capsys) -> None:
    partitions = {
        "low_res": {"batch_size": 4, "resolutions": [64]},
        "high_res": {"batch_size": 2, "resolutions": [128]},
    }
    layers = [
        {"model": {"partitions": partitions}},
        {"model": {"partitions": {"high_res": {"batch_size": 1}}}},
    ]
    model = _resolved(tmp_path, capsys, layers)["model"]
    assert model["partitions"]["low_res"]["batch_size"] == 4
    assert model["partitions"]["high_res"]["batch_size"] == 1
    assert model["partitions"]["high_res"]["resolutions"] == [128]


#: A fourth teacher, a tiny timm ViT with random weights.
FOURTH = {
    "class_path": "radio_lit.teachers.TimmTeacher",
    "init_args": {
        "model": "vit_tiny_patch16_224",
        "pretrained": False,
        "model_kwargs": {"depth": 1, "embed_dim": 32, "num_heads": 2, "img_size": 64},
    },
}


@pytest.mark.slow
def test_an_overlay_adding_a_teacher_trains_four(tmp_path) -> None:
    from radio_lit.cli.app import RadioLitCLI

    overlay = tmp_path / "vit.yaml"
    overlay.write_text(yaml.safe_dump({"model": {"teachers": {"vit": FOURTH}}}))
    cli = RadioLitCLI(
        args=[
            "fit",
            "--config",
            QUICKSTART,
            "--config",
            str(overlay),
            "--trainer.max_steps",
            "2",
            "--trainer.log_every_n_steps",
            "1",
            "--trainer.callbacks",
            "[{class_path: radio_lit.callbacks.TeacherStatsEstimation, init_args: {steps: 1}}]",
            "--trainer.logger.init_args.save_dir",
            str(tmp_path),
            "--trainer.default_root_dir",
            str(tmp_path),
        ]
    )
    assert cli.trainer.global_step == 2
    assert list(cli.model.teachers) == ["clip", "dino", "sam", "vit"]
    logged = cli.trainer.callback_metrics
    losses = sorted(k for k in logged if k.endswith("/feature_loss") and "balancer" not in k)
    assert losses == [f"train/{n}/feature_loss" for n in ("clip", "dino", "sam", "vit")], losses
    assert all(torch.isfinite(logged[k]) for k in losses)
    saved = yaml.safe_load(next(tmp_path.rglob("config.yaml")).read_text())
    assert list(saved["model"]["teachers"]) == ["clip", "dino", "sam", "vit"]
