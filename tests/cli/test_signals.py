"""A stop signal while ``radio-lit fit`` is still building its run, the way a user sends it.

``radio-lit fit`` takes the stop signals before it imports or builds anything
(:data:`radio_lit.distributed.cluster.STOP`). A Ctrl-C (``SIGINT``) or a ``SIGTERM`` while a
teacher is
being built (:class:`tests.cli.pause.BuildsUntil`: the test decides how long the build lasts,
no sleep race) stops the run at once: one line, exit status 128 + the signal, no traceback,
and no run folder (nothing was trained: the same command starts the run again). The same
through the console command itself, in a fresh interpreter, signalled as soon as it has taken
the signals (while it imports torch and Lightning).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests import forking
from tests.cli.pause import building_teacher

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")
SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}
TIMEOUT_S = 300


def _stop_line(stderr: str, name: str) -> str:
    """The one ``radio-lit:`` line of ``stderr``, checked against a traceback."""
    assert "Traceback" not in stderr, stderr[-3000:]
    (line,) = [x for x in stderr.splitlines() if x.startswith("radio-lit:")]
    assert line.startswith(f"radio-lit: {name} received while the run was being built"), line
    return line


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """``{signal name: (folder, outcome)}``: a quickstart ``fit`` per signal, started together
    in folders of their own, each signalled while its DINOv2 teacher is being built."""
    runs = {}
    for name in SIGNALS:
        folder = tmp_path_factory.mktemp(name)
        overlay = {
            "model": {"teachers": {"dino": building_teacher(folder / "building", folder / "go")}}
        }
        (folder / "run.yaml").write_text(yaml.safe_dump(overlay))
        argv = ["fit", "--config", QUICKSTART, "--config", str(folder / "run.yaml")]
        runs[name] = (
            folder,
            forking.start("radio_lit.cli.app:main", [argv], folder / "out", cwd=folder),
        )
    deadline = time.monotonic() + TIMEOUT_S
    for name, (folder, run) in runs.items():
        while not (folder / "building-0").exists():
            assert run.alive(), run.err.read_text()[-3000:]
            assert time.monotonic() < deadline, "the run never started building its teachers"
            time.sleep(0.05)
        os.kill(run.pid, SIGNALS[name])
    return {name: (folder, run.wait(deadline)) for name, (folder, run) in runs.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SIGNALS))
def test_a_signal_while_the_models_are_built_stops_in_one_line(stopped, name):
    """Was: Ctrl-C printed a 74-line ``KeyboardInterrupt`` traceback (exit 1)."""
    folder, outcome = stopped[name]
    assert outcome.exitcode == 128 + SIGNALS[name], outcome.stderr[-3000:]
    line = _stop_line(outcome.stderr, name)
    assert "nothing was trained or saved; run the same command again to start it" in line
    assert not (folder / "go").exists()  # it stopped inside the teacher's construction
    assert not (folder / "lightning_logs").exists(), list(folder.rglob("*"))


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (``SigCgt`` of /proc/PID/status)."""
    status = Path(f"/proc/{pid}/status").read_text()
    caught = int(next(x for x in status.splitlines() if x.startswith("SigCgt:")).split()[1], 16)
    return bool(caught >> (signum - 1) & 1)


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs Linux's /proc")
def test_the_console_command_takes_the_signals_before_its_imports(tmp_path):
    """``python -m radio_lit`` (the console script's code) signalled with ``SIGTERM`` once it
    handles ``SIGUSR1`` (Python does not by itself): one line, 143, not a traceback from the
    middle of ``import torch``."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "radio_lit", "fit", "--config", QUICKSTART]
    process = subprocess.Popen(
        command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 60
    while not _catches(process.pid, signal.SIGUSR1):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    _stop_line(stderr, "SIGTERM")
    assert not (tmp_path / "lightning_logs").exists()


def test_a_stop_signal_python_wraps_while_a_class_is_made_is_still_one_line(tmp_path):
    """A signal that lands while Python creates a class (``platform``'s ``uname_result``:
    ``cached_property.__set_name__``) comes back as a ``RuntimeError`` raised from the handler's
    ``BuildInterrupted``: still one line and 143, not a traceback."""
    code = (
        "import signal, sys\n"
        "from radio_lit.core.errors import BuildInterrupted\n"
        "class Wrapped:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'radio_lit.cli.app':\n"
        "            try:\n"
        "                raise BuildInterrupted(signal.SIGTERM)\n"
        "            except BuildInterrupted as stop:\n"
        "                raise RuntimeError('Error calling __set_name__') from stop\n"
        "sys.meta_path.insert(0, Wrapped())\n"
        "sys.argv = ['radio-lit', 'fit']\n"
        "from radio_lit.__main__ import main\n"
        "main()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 128 + signal.SIGTERM, done.stderr[-3000:]
    _stop_line(done.stderr, "SIGTERM")
