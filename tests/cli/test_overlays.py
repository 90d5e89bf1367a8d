"""An overlay config given alone says it is one and which full config to stack it on."""

from __future__ import annotations

from pathlib import Path

import pytest
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
