"""Shared RADIOTeacher entries under ``torch.inference_mode``, as Lightning's validation runs
them: its crops are inference tensors, which have no version counter to key a view by."""

from __future__ import annotations

from pathlib import Path

import torch

from radio_lit.teachers import RADIOTeacher
from radio_lit.training.teachers import run_teachers
from tests.export.conftest import exported, trained  # noqa: F401  (fixtures)


def test_a_validation_crop_runs_the_shared_model_once(exported: Path) -> None:  # noqa: F811
    path = str(exported / "student.pth")
    shared = {o: RADIOTeacher(path, adaptor=o, resolution=64) for o in ("backbone", "clip")}
    calls = [0]
    shared["clip"].model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    with torch.inference_mode():
        crop = torch.rand(2, 3, 96, 96, generator=torch.Generator().manual_seed(0))
        got = run_teachers(shared, crop, list(shared), (4, 4))
    assert calls[0] == 1
    own = RADIOTeacher(path, adaptor="clip", resolution=64, share=False)
    with torch.no_grad():
        expected = run_teachers({"clip": own}, crop.clone(), ["clip"], (4, 4))["clip"]
    torch.testing.assert_close(got["clip"].features, expected.features, rtol=0, atol=0)
