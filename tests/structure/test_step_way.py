"""A training step's way through the files is straight (DESIGN.md, "One training step").

``DistillationModule._shared_step`` orchestrates: it calls each stage of the step (views,
teachers, student, normalizers, matching, losses, balancer, metrics, logging), directly or
through one of its thin public delegates (``chunk_teachers``, ``normalized_targets``,
``distillation_losses``), and each stage lives in the file named for it. Traced on a real
C-RADIOv4-style step (partitions, shifted views, DAMP, the EMA student and MESA): the radio_lit
files of the functions the orchestrator
calls, in order, return at most 3 times to a file the step had left, and none of the stages
calls back into ``module.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from radio_lit.geometry.shifts import PatchShifts
from radio_lit.students.damp import DAMP
from radio_lit.students.ema import MESA
from tests.builders import tiny_module

PACKAGE = Path(__file__).resolve().parents[2] / "radio_lit"
MODULE = str(PACKAGE / "module.py")


def _trace_step() -> tuple[list[str], list[str]]:
    """(files of the orchestrator's callees in call order, stage files that called module.py)."""
    shifts = PatchShifts("uniform", max_shift=1, margin=0.25)
    module = tiny_module(shifts=shifts, damp=DAMP(std=0.1), mesa=MESA(decay=0.5)).train()
    module.student_step.begin(module.student, 0, 0)
    batch = torch.randint(0, 255, (4, 3, 96, 96), dtype=torch.uint8)
    stages: list[str] = []
    callbacks_into_module: list[str] = []
    depth = {"step": None}

    def step_level(frame) -> bool:  # the orchestrator, or a comprehension inside it
        while frame is not None and frame.f_code.co_filename == MODULE:
            if frame is depth["step"]:
                return True
            if not frame.f_code.co_name.startswith("<"):
                return False
            frame = frame.f_back
        return False

    def profile(frame, event, arg):
        if event != "call":
            return
        code, parent = frame.f_code, frame.f_back
        if code.co_name == "_shared_step" and code.co_filename == MODULE:
            depth["step"] = frame
            return
        if depth["step"] is None or not code.co_filename.startswith(str(PACKAGE)):
            return
        if code.co_filename == MODULE and code.co_name.startswith("<"):
            return  # a comprehension of module.py
        delegate = parent.f_code.co_filename == MODULE and step_level(parent.f_back)
        if step_level(parent) and code.co_filename != MODULE or delegate:
            stages.append(code.co_filename)  # a stage, called directly or by a thin delegate
        elif code.co_filename == MODULE and not step_level(parent):
            callbacks_into_module.append(f"{parent.f_code.co_filename}:{code.co_name}")

    sys.setprofile(profile)
    try:
        module._shared_step(batch, "train")
    finally:
        sys.setprofile(None)
    return stages, callbacks_into_module


def returns(files: list[str]) -> list[str]:
    """The files the way comes back to after leaving them (consecutive calls into one file
    are one stop)."""
    stops = [f for i, f in enumerate(files) if i == 0 or files[i - 1] != f]
    return [f for i, f in enumerate(stops) if f in stops[:i]]


def test_the_way_of_a_step_through_the_files_is_straight():
    stages, into_module = _trace_step()
    rel = [str(Path(f).relative_to(PACKAGE)) for f in stages]
    for stage in ("training/views.py", "training/teachers.py", "training/student_step.py"):
        assert stage in rel, rel
    for stage in ("training/matching.py", "training/normalization.py", "training/losses.py"):
        assert stage in rel, rel
    order = [
        rel.index(s)
        for s in (
            "training/views.py",
            "training/teachers.py",
            "training/student_step.py",
            "training/normalization.py",  # targets before the heads (export/head_spaces.py)
            "training/matching.py",
            "training/losses.py",
        )
    ]
    assert order == sorted(order), rel
    back = returns(rel)
    assert len(back) <= 3, f"the step returns to {back} along {rel}"
    assert not into_module, f"stages calling back into module.py: {into_module}"


def test_the_measure_sees_a_way_that_goes_back():
    assert returns(["a", "b", "b", "a", "c", "b"]) == ["a", "b"]
