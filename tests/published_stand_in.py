"""Stand-ins for a published RADIO in tests and config checks: a tiny radio-lit export in
NVlabs' layout (``radio-lit export --format radio``), written once per set of adaptor names.

The CPU twins of ``configs/recipes/{adapt,extend}`` start from the quickstart's student,
trained and exported; their tests and :mod:`benchmarks.gpu_check` build them (and the
real-size recipes, whose ``RADIOTeacher`` entries name ``nvidia/C-RADIOv4-H``) from this file
instead, which has the quickstart student's architecture and random weights, and one adaptor
head per given name: a SAM-like head without summary for names containing ``sam`` (as a
release's ``sam``/``sam3``, trained without a summary term), a CLIP-like head otherwise.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import torch

QUICKSTART_STUDENT = dict(
    model="vit_tiny_patch16_224",
    max_resolution=512,
    model_kwargs=dict(depth=4, embed_dim=96, num_heads=3),
    cpe_align_corners=False,
)


@functools.cache
def radio_stand_in(adaptors: tuple[str, ...] = ("clip", "dino", "sam")) -> Path:
    """The path of a tiny export (``.pth``, NVlabs' layout) with the quickstart's student
    and one adaptor head per name of ``adaptors``; removed when the process ends."""
    from radio_lit.export.convert import module_inference_model
    from radio_lit.export.files import save_radio
    from radio_lit.module import DistillationModule
    from radio_lit.students import CPEViT
    from tests.teachers.tiny import tiny_clip_teacher, tiny_sam_teacher

    torch.manual_seed(0)
    teachers = {
        name: tiny_sam_teacher(resolution=64) if "sam" in name else tiny_clip_teacher()
        for name in adaptors
    }
    module = DistillationModule(
        student=CPEViT(**QUICKSTART_STUDENT), teachers=teachers, student_resolution=64
    )
    folder = Path(tempfile.mkdtemp(prefix="radio_lit_stand_in_"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "last.pth"
    save_radio(module_inference_model(module.eval()), path)
    return path
