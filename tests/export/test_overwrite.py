"""Nothing a user keeps is overwritten unasked: ``radio-lit export`` (every ``--format``)
refuses an output that exists in one line naming ``--overwrite``; exports of EMA and raw
weights, or of two checkpoints, never meet by default; every export records its source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from radio_lit.cli.app import main
from radio_lit.cli.export import FORMAT_SUFFIXES, outputs
from tests.export.tiny_export import saved_run


def export(*argv: str) -> None:
    main(["export", *argv])


def refused(capsys, *argv: str) -> str:
    """The one-line error of an export that must be refused (exit 2)."""
    capsys.readouterr()  # what earlier commands printed
    with pytest.raises(SystemExit) as stopped:
        export(*argv)
    assert stopped.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()
    assert len(error) == 2 and error[1].startswith("(set RADIO_LIT_TRACEBACK=1")
    return error[0]


def formats(capsys, checkpoint: Path) -> list[str]:
    """Every ``--format`` the command offers, read from its own refusal of an unknown one."""
    message = refused(capsys, str(checkpoint), "--format", "none-such")
    listed = message.split("choose from", 1)[1].split(")", 1)[0]
    return [name.strip(" '\"") for name in listed.split(",")]


@pytest.fixture
def checkpoint(trained, tmp_path: Path) -> Path:
    return saved_run(trained, tmp_path / "version_0", step=7)


def test_every_format_refuses_what_exists_and_keeps_it(checkpoint: Path, capsys) -> None:
    """A format added later is covered too: its files, or anything named after the stem."""
    offered = formats(capsys, checkpoint)
    assert {"both", "radio", "safetensors", "onnx", "hf", "timm"} <= set(offered)
    for fmt in offered:
        stem = checkpoint.parent.parent / "kept" / fmt
        parts = ["radio", "safetensors"] if fmt == "both" else [fmt]
        known = [p for f in parts if f in FORMAT_SUFFIXES for p in outputs(f, stem)]
        existing = known or [stem.with_name(stem.name + ".bin")]
        folder = FORMAT_SUFFIXES.get(fmt) == ("",)  # hf, timm: a folder
        target = existing[-1] / "README.md" if folder else existing[-1]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("edited by hand\n")
        message = refused(capsys, str(checkpoint), "--format", fmt, "--output", str(stem))
        assert "--overwrite" in message and str(existing[-1]) in message, (fmt, message)
        assert target.read_text() == "edited by hand\n"


def test_an_edited_model_card_survives_until_overwrite(checkpoint: Path, capsys) -> None:
    folder = checkpoint.parent.parent / "export" / "last-hf"
    export(str(checkpoint), "--format", "hf")
    card = folder / "README.md"
    card.write_text(card.read_text().replace("license: other", "license: apache-2.0"))
    edited = card.read_text()
    message = refused(capsys, str(checkpoint), "--format", "hf")
    assert message.startswith(f"radio-lit: error: radio-lit export: {folder} is not empty (")
    assert message.endswith(
        "give --overwrite to write into it (files of the same names are "
        "replaced), or another --output"
    )
    assert card.read_text() == edited
    export(str(checkpoint), "--format", "hf", "--overwrite")
    assert "license: other" in card.read_text()


def test_a_folder_with_an_unrelated_config_is_refused(checkpoint: Path, capsys) -> None:
    folder = checkpoint.parent.parent / "mine"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "bert"}')
    assert "--overwrite" in refused(
        capsys, str(checkpoint), "--format", "hf", "--output", str(folder)
    )
    assert json.loads((folder / "config.json").read_text()) == {"model_type": "bert"}


def test_raw_and_ema_exports_never_meet_and_say_which_they_are(trained, tmp_path, capsys):
    checkpoint = saved_run(trained, tmp_path / "version_0", step=7)
    state = torch.load(checkpoint, weights_only=True)
    weights = state["state_dict"]
    for key in [k for k in weights if k.startswith(("student.", "heads."))]:
        weights["ema." + key] = (
            weights[key] * 0.5 if weights[key].is_floating_point() else weights[key]
        )
    torch.save(state, checkpoint)
    export(str(checkpoint))
    export(str(checkpoint), "--ema")
    written = capsys.readouterr().out.split()
    folder = checkpoint.parent.parent / "export"
    assert sorted(p.name for p in folder.iterdir()) == [
        "last-ema.json",
        "last-ema.pth",
        "last-ema.safetensors",
        "last.json",
        "last.pth",
        "last.safetensors",
    ]
    assert written == [str(folder / n) for n in ("last.pth", "last.safetensors", "last.json")] + [
        str(folder / n) for n in ("last-ema.pth", "last-ema.safetensors", "last-ema.json")
    ]
    for name, weights_kind in (("last", "raw"), ("last-ema", "ema")):
        source = json.loads((folder / f"{name}.json").read_text())["radio_lit"]["source"]
        assert source == {"checkpoint": str(checkpoint), "step": 7, "weights": weights_kind}
    assert "--overwrite" in refused(capsys, str(checkpoint), "--ema", "--format", "radio")
