"""Every module that moved keeps its old import path: the same module, a warning naming the new.

Run in a fresh interpreter: configs written before the regrouping name ``class_path``s by the
old paths (``radio_lit.shifts.PatchShifts``), as do saved hyperparameters and users' code.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from radio_lit._aliases import MOVED

ROOT = Path(__file__).resolve().parents[2]

_SCRIPT = """
import importlib, warnings
import radio_lit
from radio_lit._aliases import MOVED
for old, new in MOVED.items():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(old)
    assert module is importlib.import_module(new), old
    assert module.__name__ == new and module.__spec__.name == new, (old, module.__spec__)
    assert any(new in str(w.message) and w.category is DeprecationWarning for w in caught), old

# a class_path of an old config, as jsonargparse builds it for `radio-lit fit`
from jsonargparse import ArgumentParser
from radio_lit.geometry.shifts import PatchShifts
parser = ArgumentParser()
parser.add_argument("--shifts", type=PatchShifts)
config = parser.parse_args(
    ["--shifts", '{"class_path": "radio_lit.shifts.PatchShifts", "init_args": {"std": 0.5}}']
)
shifts = parser.instantiate_classes(config).shifts
assert type(shifts) is PatchShifts and shifts.std == 0.5, shifts

from radio_lit.grid import resample
from radio_lit.geometry.grid import resample as moved
assert resample is moved
from radio_lit.cli import RadioLitCLI, main
from radio_lit.cli.app import RadioLitCLI as App, main as app_main
assert main is app_main and RadioLitCLI is App
print("ok")
"""


def test_old_module_names_and_class_paths_are_the_moved_ones():
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def test_the_shipped_configs_name_no_old_path():
    paths = {
        value
        for path in sorted((ROOT / "configs").rglob("*.yaml"))
        for value in _class_paths(yaml.safe_load(path.read_text()))
        if value.startswith("radio_lit.")
    }
    assert paths, "the configs name radio_lit classes"
    stale = sorted(p for p in paths if p.rpartition(".")[0] in MOVED)
    assert not stale, f"shipped configs naming moved modules: {stale}"


def _class_paths(node):
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "class_path" and isinstance(value, str):
                yield value
            yield from _class_paths(value)
    elif isinstance(node, list):
        for item in node:
            yield from _class_paths(item)
