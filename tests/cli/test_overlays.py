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


def _defaults(class_path: str) -> dict:
    """A teacher class's keyword defaults, read from its signature."""
    import importlib
    import inspect

    module, name = class_path.rsplit(".", 1)
    parameters = inspect.signature(getattr(importlib.import_module(module), name)).parameters
    return {p.name: p.default for p in parameters.values() if p.default is not p.empty}


@pytest.mark.parametrize(
    "init_args",
    [
        {"model": "vit_small_patch16_dinov3"},  # DINOv3Teacher, the try
        {"model": "vit_tiny_patch16_224", "pretrained": False, "model_kwargs": {"depth": 1}},
    ],
    ids=["DINOv3Teacher", "TimmTeacher"],
)
def test_an_entry_whose_class_path_changes_starts_fresh(init_args, tmp_path, capsys) -> None:
    """Only the overlay's init_args and the new class's defaults: none of quickstart's
    DINOv2 settings (``pretrained: false``, ``model_kwargs`` depth 2, width 48, img_size 56)
    that the new class also accepts; one line of the log says so."""
    class_path = (
        "radio_lit.teachers.DINOv3Teacher"
        if init_args["model"].endswith("dinov3")
        else "radio_lit.teachers.TimmTeacher"
    )
    overlay = {"model": {"teachers": {"dino": {"class_path": class_path, "init_args": init_args}}}}
    teachers = _resolved(tmp_path, capsys, overlay)["model"]["teachers"]
    assert teachers["dino"] == {
        "class_path": class_path,
        "init_args": {**_defaults(class_path), **init_args},
    }
    assert teachers["clip"]["init_args"]["model_cfg"]["embed_dim"] == 32  # the others kept


def test_a_class_path_change_is_one_line_of_the_log(tmp_path) -> None:
    """Through the real command (``radio_lit.cli.app.main``, what the console script runs, in
    a process forked from the tests' fork server): one line on standard error, the printed
    config intact."""
    import os

    from tests import forking

    overlay = tmp_path / "d3.yaml"
    swap = {"class_path": "radio_lit.teachers.DINOv3Teacher", "init_args": {"model": "m"}}
    overlay.write_text(yaml.safe_dump({"model": {"teachers": {"dino": swap}}}))
    argv = ["fit", "--config", QUICKSTART, "--config", str(overlay), "--print_config"]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = forking.run(
        "radio_lit.cli.app:main", [argv], tmp_path / "forked", 120, env=env, cwd=tmp_path
    )
    assert done.exitcode == 0, done.stderr[-3000:]
    said = [line for line in done.stderr.splitlines() if "starts fresh" in line]
    assert said == [
        "config: model.teachers.dino: class_path radio_lit.teachers.DINOv2Teacher -> "
        "radio_lit.teachers.DINOv3Teacher: starts fresh, from the given init_args and "
        "DINOv3Teacher's defaults (the earlier init_args are dropped)"
    ]
    dino = yaml.safe_load(done.stdout)["model"]["teachers"]["dino"]
    assert dino["init_args"]["model"] == "m" and dino["init_args"]["model_kwargs"] is None


@pytest.mark.parametrize(
    ("earlier", "given"),
    [
        (None, "radio_lit.teachers.DINOv2Teacher"),  # quickstart's full path, then full
        (None, "DINOv2Teacher"),  # full, then the short name jsonargparse accepts
        ("DINOv2Teacher", "radio_lit.teachers.DINOv2Teacher"),  # short, then full
        ("DINOv2Teacher", "DINOv2Teacher"),  # short, then short
    ],
    ids=["full-full", "full-short", "short-full", "short-short"],
)
def test_a_class_value_merges_while_its_class_path_stays(earlier, given, tmp_path, capsys) -> None:
    """The same class named again, by its full path or its short name in either config,
    merges its init_args: one rule for both spellings (a short name was once taken for another
    class, and every earlier argument of the teacher was dropped)."""
    layers = [
        {"model": {"teachers": {"dino": {"class_path": given, "init_args": {"resolution": 42}}}}}
    ]
    if earlier is not None:  # the earlier layer names quickstart's class by its short name
        layers.insert(0, {"model": {"teachers": {"dino": {"class_path": earlier}}}})
    dino = _resolved(tmp_path, capsys, layers)["model"]["teachers"]["dino"]["init_args"]
    assert dino["resolution"] == 42 and dino["pretrained"] is False
    assert dino["model_kwargs"] == {"depth": 2, "embed_dim": 48, "num_heads": 2, "img_size": 56}


def test_another_class_by_its_short_name_starts_fresh(tmp_path, capsys) -> None:
    """The short name of another class is another class: quickstart's DINOv2 settings go."""
    init_args = {"model": "vit_tiny_patch16_224", "pretrained": False}
    overlay = {
        "model": {"teachers": {"dino": {"class_path": "TimmTeacher", "init_args": init_args}}}
    }
    dino = _resolved(tmp_path, capsys, overlay)["model"]["teachers"]["dino"]
    assert dino["class_path"].endswith("TimmTeacher")
    assert dino["init_args"] == {**_defaults("radio_lit.teachers.TimmTeacher"), **init_args}


def test_a_mapping_inside_a_dict_setting_merges_at_every_depth(tmp_path, capsys) -> None:
    """``clip.model_cfg.vision_cfg: {layers: 3}`` changes one key of the quickstart's
    vision_cfg (a ``dict[str, Any]`` inside a ``dict[str, Any]``): the teacher built from the
    printed config is the quickstart's tiny CLIP with a third layer, not open_clip's default
    vision tower (width 768 at 224 px: 23.6 M parameters instead of 1.8 M)."""
    from radio_lit.teachers import OpenCLIPTeacher

    vision_cfg = {"model_cfg": {"vision_cfg": {"layers": 3}}}
    overlay = {"model": {"teachers": {"clip": {"init_args": vision_cfg}}}}
    clip = _resolved(tmp_path, capsys, overlay)["model"]["teachers"]["clip"]
    vision = clip["init_args"]["model_cfg"]["vision_cfg"]
    assert vision == {
        "image_size": 56,
        "layers": 3,
        "width": 64,
        "head_width": 32,
        "patch_size": 14,
    }
    assert clip["init_args"]["model_cfg"]["text_cfg"]["vocab_size"] == 49408
    teacher = OpenCLIPTeacher(**clip["init_args"])
    parameters = sum(p.numel() for p in teacher.parameters())
    assert 1.5e6 < parameters < 2.5e6, parameters


def test_a_nested_model_kwargs_mapping_merges(tmp_path, capsys) -> None:
    """SAM3's ``model_kwargs.backbone_config``: a later config changes one key of it."""
    current = str(ROOT / "configs" / "quickstart-current.yaml")
    overlay = tmp_path / "sam3.yaml"
    change = {"model_kwargs": {"backbone_config": {"num_hidden_layers": 1}}}
    overlay.write_text(yaml.safe_dump({"model": {"teachers": {"sam3": {"init_args": change}}}}))
    from radio_lit.cli.app import main

    with pytest.raises(SystemExit):
        main(["fit", "--config", current, "--config", str(overlay), "--print_config"])
    sam3 = yaml.safe_load(capsys.readouterr().out)["model"]["teachers"]["sam3"]["init_args"]
    shipped = yaml.safe_load(Path(current).read_text())["model"]["teachers"]["sam3"]["init_args"]
    expected = shipped["model_kwargs"]
    expected["backbone_config"]["num_hidden_layers"] = 1
    assert sam3["model_kwargs"] == expected


def test_null_is_a_value_in_a_config_and_removes_in_a_later_one(tmp_path, capsys) -> None:
    """In a config's own values (the first config, or a key no earlier config gave) ``null``
    is the keyword argument ``None``; a later config's ``null`` removes the earlier entry."""
    first = yaml.safe_load(Path(QUICKSTART).read_text())
    kwargs = first["model"]["teachers"]["dino"]["init_args"]["model_kwargs"]
    kwargs["global_pool"] = None  # given as None in the first config: passed as None
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(first))
    later = {"init_args": {"model_kwargs": {"depth": None, "class_token": None}}}
    overlay = tmp_path / "later.yaml"
    overlay.write_text(yaml.safe_dump({"model": {"teachers": {"dino": later}}}))
    from radio_lit.cli.app import main

    with pytest.raises(SystemExit):
        main(["fit", "--config", str(base), "--print_config"])
    dino = yaml.safe_load(capsys.readouterr().out)["model"]["teachers"]["dino"]["init_args"]
    assert dino["model_kwargs"] == {**kwargs, "global_pool": None}
    with pytest.raises(SystemExit):
        main(["fit", "--config", str(base), "--config", str(overlay), "--print_config"])
    dino = yaml.safe_load(capsys.readouterr().out)["model"]["teachers"]["dino"]["init_args"]
    expected = {k: v for k, v in kwargs.items() if k != "depth"}
    assert dino["model_kwargs"] == {**expected, "class_token": None}


def test_merged_mapping_is_a_merge_patch_at_every_depth() -> None:
    from radio_lit.cli.overlays import merged_mapping

    earlier = {"a": 1, "b": {"c": 2, "d": {"e": 3, "f": 4}}, "g": [1, 2], "h": 5}
    patch = {"b": {"d": {"e": None, "x": 9}}, "g": [3], "h": None, "new": None}
    assert merged_mapping(patch, earlier) == {
        "a": 1,
        "b": {"c": 2, "d": {"f": 4, "x": 9}},
        "g": [3],  # a list is replaced
        "new": None,  # nothing came before: the value None
    }
    assert earlier["b"]["d"] == {"e": 3, "f": 4}  # not changed in place
    assert merged_mapping({"k": None}, None) == {"k": None}  # a first config's null


#: The one line for a misspelt argument of a teacher (of the data).
_MODL = "model.teachers.dino.init_args.modl: DINOv2Teacher takes no argument 'modl' (did you mean"


@pytest.mark.parametrize(
    ("given", "line"),
    [
        (["--model.teachers.dino.init_args.modl", "x"], f"{_MODL} 'model'?)"),
        ({"model": {"teachers": {"dino": {"init_args": {"modl": "x"}}}}}, f"{_MODL} 'model'?)"),
        (
            {"model": {"teachers": {"vit": {**FOURTH, "init_args": {"modl": "x"}}}}},
            f"{_MODL.replace('dino', 'vit').replace('DINOv2', 'Timm')} 'model'?)",
        ),
        (
            {"data": {"init_args": {"batch_sise": 4}}},
            "data.init_args.batch_sise: ImageFolderDataModule takes no argument 'batch_sise' "
            "(did you mean 'batch_size'?)",
        ),
    ],
    ids=["flag", "config", "a new entry", "data"],
)
def test_a_misspelt_argument_names_its_entry_and_the_closest_one(
    given, line, tmp_path, capsys
) -> None:
    """Through the command: one line naming the entry and the argument it takes, exit 2."""
    from radio_lit.cli.app import main

    if isinstance(given, dict):
        path = tmp_path / "typo.yaml"
        path.write_text(yaml.safe_dump(given))
        given = ["--config", str(path)]
    with pytest.raises(SystemExit) as stopped:
        main(["fit", "--config", QUICKSTART, *given, "--print_config"])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.splitlines()
    assert error[0] == f"radio-lit: error: {line}"
    assert len(error) == 2 and error[1].startswith("(set RADIO_LIT_TRACEBACK=1"), error


@pytest.mark.parametrize(
    "data",
    [
        "radio_lit.data.SyntheticDataModule",
        {"class_path": "radio_lit.data.SyntheticDataModule", "init_args": {"num_samples": 10}},
    ],
    ids=["by name", "with init_args"],
)
def test_a_class_option_given_another_class_starts_fresh(data, tmp_path, capsys) -> None:
    """Not only a mapping's entry: ``data`` swapped for another data module keeps none of
    the quickstart's ImageFolderDataModule settings (``crop_size: 128``, ``val_dir``) that
    SyntheticDataModule also takes."""
    given = data["init_args"] if isinstance(data, dict) else {}
    printed = _resolved(tmp_path, capsys, {"data": data})["data"]
    assert printed == {
        "class_path": "radio_lit.data.SyntheticDataModule",
        "init_args": {**_defaults("radio_lit.data.SyntheticDataModule"), **given},
    }
