"""The tiny RADIO-layout student of the export tests, and radio-lit's own (unfolded) outputs."""

from __future__ import annotations

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
        student = module.student(normalize_view(images, module.student_mean, module.student_std))
        outputs = {"backbone": (student.summary[:, 0], student.features)}
        for name, heads in module.heads.items():
            features = module.normalizers[name].inverse(heads.features(student.features))
            slot = module.summary_token.get(name)
            summary = heads.summary(student.summary[:, slot]) if slot is not None else None
            outputs[name] = (summary, features)
    return outputs
