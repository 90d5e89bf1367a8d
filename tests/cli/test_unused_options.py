"""Every option ``radio-lit fit`` accepts takes effect: LightningCLI's ``--optimizer`` and
``--lr_scheduler`` (which would replace or be dropped beside the module's own optimizer and
schedule) are not in the help and are refused in one line naming what to set instead;
a run's ``config.yaml`` written before, which holds them as ``null``, still loads."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from radio_lit.cli import app as cli

ROOT = Path(__file__).resolve().parents[2]
FIT = ["fit", "--config", str(ROOT / "configs" / "quickstart.yaml")]


def _refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in lines[0], lines  # the message, the hint
    return lines[0]


@pytest.mark.parametrize(
    "given",
    [
        ["--lr_scheduler", "torch.optim.lr_scheduler.LinearLR"],
        ["--lr_scheduler", "torch.optim.lr_scheduler.LinearLR", "--lr_scheduler.start_factor", "0"],
        ["--lr_scheduler.start_factor=0.0"],
    ],
)
def test_an_lr_scheduler_is_refused_naming_the_modules_schedule(given, capsys, tmp_path):
    line = _refused([*FIT, *given, f"--trainer.default_root_dir={tmp_path}"], capsys)
    assert "lr_scheduler" in line and "--model.warmup_steps" in line, line
    assert "--model.min_lr_ratio" in line, line
    assert not list(tmp_path.iterdir())  # refused before anything was built


def test_an_optimizer_is_refused_naming_the_modules_option(capsys):
    line = _refused([*FIT, "--optimizer", "torch.optim.SGD", "--optimizer.lr", "0.1"], capsys)
    assert "--model.optimizer" in line, line


def test_a_config_that_gives_a_schedule_is_refused(tmp_path, capsys):
    config = tmp_path / "schedule.yaml"
    schedule = {"class_path": "torch.optim.lr_scheduler.LinearLR", "init_args": {}}
    config.write_text(yaml.safe_dump({"lr_scheduler": schedule}))
    line = _refused([*FIT, "--config", str(config), "--print_config"], capsys)
    assert "--model.warmup_steps" in line, line


def test_neither_is_in_the_full_help_and_an_old_run_config_still_loads(tmp_path, capsys):
    with pytest.raises(SystemExit):
        cli.main([*FIT, "--help-all"])
    help_text = capsys.readouterr().out
    assert "--model.optimizer" in help_text and "--model.warmup_steps" in help_text
    assert "--lr_scheduler" not in help_text
    assert "--optimizer" not in help_text.replace("--model.optimizer", "")
    old = tmp_path / "config.yaml"  # what runs of earlier versions saved
    old.write_text(yaml.safe_dump({"optimizer": None, "lr_scheduler": None, "ckpt_path": None}))
    with pytest.raises(SystemExit) as stop:
        cli.main([*FIT, "--config", str(old), "--print_config"])
    assert stop.value.code in (0, None)
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["model"]["warmup_steps"] == yaml.safe_load(
        (ROOT / "configs" / "quickstart.yaml").read_text()
    )["model"].get("warmup_steps", 0)
