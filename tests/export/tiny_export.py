"""The tiny RADIO-layout student of the export tests, and radio-lit's own (unfolded) outputs."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import lightning.pytorch as pl
import torch
import yaml

from radio_lit.data.views import normalize_view
from tests.teachers.tiny import tiny_teacher_configs

#: The tiny module's student and teachers as a run's config.yaml records them.
STUDENT = {
    "class_path": "radio_lit.students.CPEViT",
    "init_args": {
        "model": "vit_tiny_patch16_224",
        "max_resolution": 256,
        "model_kwargs": {"depth": 2, "embed_dim": 32, "num_heads": 2},
        "num_cls_tokens": 3,
        "num_registers": 2,
        "cpe_align_corners": False,
    },
}
TEACHERS = tiny_teacher_configs(sam_resolution=64)


def saved_run(
    module: pl.LightningModule,
    folder: Path,
    step: int | None = None,
    name: str = "last.ckpt",
    config: dict | None = None,
) -> Path:
    """``module`` saved as a radio-lit fit run would leave it: ``folder/checkpoints/<name>``
    (returned; its ``global_step`` ``step`` if given) beside the run's ``config.yaml`` (PhiS
    normalizers, student at 64 px; ``config``'s sections and ``model`` keys added)."""
    checkpoint = folder / "checkpoints" / name
    checkpoint.parent.mkdir(parents=True, exist_ok=True)
    state = {"state_dict": module.state_dict()}
    if step is not None:
        state["global_step"] = step
    torch.save(state, checkpoint)
    extra = dict(config or {})
    model = {"student": STUDENT, "teachers": TEACHERS, "student_resolution": 64}
    model["normalizer"] = {"class_path": "radio_lit.normalizers.PhiS"}
    model.update(extra.pop("model", {}))
    (folder / "config.yaml").write_text(yaml.safe_dump({"model": model, **extra}))
    return checkpoint


def own_outputs(module: pl.LightningModule, images: torch.Tensor) -> dict[str, tuple]:
    """radio-lit's own forward: student, heads, then each normalizer's inverse."""
    with torch.no_grad():
        student = module.student(normalize_view(images, *module.conditioner.values))
        outputs = {"backbone": (student.summary[:, 0], student.features)}
        for name, heads in module.heads.items():
            features = module.normalizers[name].inverse(heads.features(student.features))
            slot = module.summary_token.get(name)
            summary = heads.summary(student.summary[:, slot]) if slot is not None else None
            outputs[name] = (summary, features)
    return outputs


#: The outputs of :func:`tiny_radio_export`: the quickstart's teacher names and C-RADIOv4's
#: adaptor names (NVlabs/RADIO README, "Supported Adaptors"); SAM's and SAM3's without a summary.
STAND_IN_OUTPUTS = ("clip", "dino", "sam", "siglip2-g", "dino_v3", "sam3")


@functools.cache
def tiny_radio_export() -> Path:
    """A tiny radio-lit student exported in NVlabs' layout (``radio-lit export --format
    radio``) with one adaptor head per name of :data:`STAND_IN_OUTPUTS` (tiny DINOv2 teachers;
    tiny SAM teachers, no summary, for ``sam`` and ``sam3``): the stand-in of a published RADIO
    model for ``RADIOTeacher`` entries in the shipped-config tests. Written once per process
    into a folder removed at exit; random weights, identity normalizers."""
    from radio_lit.export import module_inference_model, save_radio
    from tests.builders import tiny_module, tiny_student
    from tests.teachers.tiny import tiny_dinov2_teacher, tiny_sam_teacher

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        sam, dino = tiny_sam_teacher, tiny_dinov2_teacher
        teachers = {n: sam(64) if n.startswith("sam") else dino() for n in STAND_IN_OUTPUTS}
        student = tiny_student(num_cls_tokens=6, num_registers=2, cpe_align_corners=False)
        module = tiny_module(student=student, teachers=teachers)
    folder = Path(tempfile.mkdtemp(prefix="radio-stand-in-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return save_radio(module_inference_model(module.eval()), folder / "c-radio-stand-in.pth")
