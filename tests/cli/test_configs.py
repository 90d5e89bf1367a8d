"""The CLI on the shipped configs: callback presets compose, a teacher overrides the
normalizer, a wrong class name is one clear error. (One flag swapping the normalizer for every
teacher: tests/cli/test_quickstart.py, which trains with each; every shipped config is built,
stepped and chained by tests/configs/.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from radio_lit.cli.app import RadioLitCLI, main

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")
PRESETS = sorted(str(p) for p in (ROOT / "callbacks").glob("*.yaml"))


def instantiate(*args: str) -> RadioLitCLI:
    return RadioLitCLI(args=list(args), run=False)


@pytest.mark.parametrize("preset", PRESETS, ids=lambda p: Path(p).name)
def test_callback_presets_compose_with_a_config(preset, tmp_path, monkeypatch):
    base = tmp_path / "base.yaml"
    config = yaml.safe_load(Path(QUICKSTART).read_text())
    config["trainer"]["callbacks"] = []
    base.write_text(yaml.safe_dump(config))
    listed = yaml.safe_load(Path(preset).read_text())["trainer"]["callbacks+"]
    # A preset's dataset folder (the segmentation probe's ADE20k root, relative), laid out
    # empty in the scratch folder the preset is read from.
    monkeypatch.chdir(tmp_path)
    for entry in listed:
        root = (entry.get("init_args") or {}).get("root", "radio_lit:")
        for split in ("training", "validation") if not root.startswith("radio_lit:") else ():
            (tmp_path / root / "images" / split).mkdir(parents=True, exist_ok=True)
    cli = instantiate("--config", str(base), "--config", preset)
    names = [type(c).__name__ for c in cli.trainer.callbacks]
    for entry in listed:
        assert entry["class_path"].rsplit(".", 1)[1] in names


def test_a_teacher_overrides_the_normalizer_and_the_loss_swaps():
    cli = instantiate(
        "--config",
        QUICKSTART,
        "--model.normalizer_overrides",
        '{"sam": "radio_lit.normalizers.GlobalStandardize"}',
        "--model.loss",
        "radio_lit.losses.HybridSmoothL1",
    )
    assert type(cli.model.normalizers["sam"]).__name__ == "GlobalStandardize"
    assert type(cli.model.normalizers["clip"]).__name__ == "PhiS"
    assert type(cli.model.feature_loss).__name__ == "HybridSmoothL1"
    assert cli.model.feature_loss.beta == 0.9


def test_a_wrong_teacher_class_is_a_clear_parse_error(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "fit",
                "--config",
                QUICKSTART,
                "--model.teachers.clip.class_path",
                "radio_lit.teachers.Nope",
            ]
        )
    assert exit_info.value.code == 2
    assert "radio_lit.teachers.Nope" in capsys.readouterr().err
