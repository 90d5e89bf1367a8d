"""benchmarks/radio_sharing.py on the shrink recipe's CPU twin: the shared model is held once
(a quarter of the memory of four entries) and runs once per view (one forward, not four), and
the table's last line gives the ratios."""

import pytest

from benchmarks.radio_sharing import main
from tests.export.tiny_export import tiny_radio_export


@pytest.mark.slow
def test_one_shared_model_against_one_entry_per_output(capsys):
    model = f"--model={tiny_radio_export()}"  # an export with the twin's outputs, made fast
    sides = main([model, "--batch-size=2", "--iters=1", "--steps=1", "--warmup=0"])
    separate, shared = sides["one entry per output"], sides["one shared model"]
    assert (separate["models"], separate["forwards"]) == (4, 4)
    assert (shared["models"], shared["forwards"]) == (1, 1)
    assert shared["teacher_mib"] * 4 == pytest.approx(separate["teacher_mib"], rel=1e-12)
    assert all(side["step_ms"] > 0 for side in sides.values())
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("shared / one entry per output: teacher_mib 0.250, teachers_ms ")
