"""Two ``radio-lit ablate`` runs with one ``--out``: the second is refused in one line while
the first runs (they would write into the same row and upsampler run folders), and a first
one that was killed leaves nothing that blocks the next."""

from __future__ import annotations

import multiprocessing
import os
import signal

import pytest

from radio_lit.ablation.out_lock import holding
from radio_lit.cli.app import main


def _hold(out, ready) -> None:
    with holding(out):
        ready.set()
        signal.pause()  # until killed, as an ablation in the middle of its rows


def test_a_second_ablation_in_the_same_out_is_refused_until_the_first_ends(tmp_path, capsys):
    out = tmp_path / "ablations"
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    first = context.Process(target=_hold, args=(out, ready))
    first.start()
    try:
        assert ready.wait(60)
        with pytest.raises(SystemExit) as stop:
            main(["ablate", "--rows", "MSE", "--out", str(out)])
        assert stop.value.code == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 2 and "Traceback" not in lines[0], lines  # the message, the hint
        assert f"--out {out}" in lines[0] and f"process {first.pid}" in lines[0], lines[0]
        assert "give another --out" in lines[0]
        assert sorted(p.name for p in out.iterdir()) == [".ablate.lock"]  # nothing written
    finally:
        os.kill(first.pid, signal.SIGKILL)  # killed: the kernel releases its lock
        first.join()
    with holding(out):  # the next ablation goes on in the folder
        assert (out / ".ablate.lock").read_text() == str(os.getpid())
