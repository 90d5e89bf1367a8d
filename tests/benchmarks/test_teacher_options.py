"""benchmarks/teacher_options.py on the quickstart's DINOv2 on CPU: every option runs or is
refused with its reason, the ones that keep the math give the eager outputs, FP8 is skipped
with the reason."""

import pytest
import torch

from benchmarks.teacher_options import main
from radio_lit.teachers.speed import fp8_refusal


@pytest.mark.slow
def test_every_teacher_option_is_measured_against_the_eager_teacher(capsys):
    main(["--teachers=dino", "--batch-size=2", "--iters=1", "--warmup=0", "--fp8=rowwise"])
    out = capsys.readouterr().out
    rows = {line[:26].strip(): line[26:] for line in out.splitlines()[1:] if line[:1].isalpha()}
    fastest = next(option for option in rows if option.startswith("compile + "))
    assert fastest in ("compile + flash", "compile + math")  # the faster backend, by timing
    for option in ("attention flash", "attention math", "compile aot_eager", fastest):
        columns = rows[option].split()
        assert columns[-4:] == ["1.00000", "0.00000", "1.00000", "0.00000"], option
    for backend in ("cudnn", "efficient"):
        assert "refused:" in rows[f"attention {backend}"]
        assert "backends that run it here: flash, math" in rows[f"attention {backend}"]
    assert f"skipped: {fp8_refusal(torch.device('cpu'))}" in rows["fp8 rowwise"]
    assert "fidelity of a run on FP8 targets: skipped" in out
