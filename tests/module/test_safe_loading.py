"""Checkpoints and weight files load as tensors only: a pickle that runs code is refused."""

from __future__ import annotations

import pytest
import torch

from radio_lit.students import CPEViT
from tests.builders import tiny_module


class RunsCode:
    """Unpickling this object would create ``marker`` (a stand-in for arbitrary code)."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_checkpoint_that_would_run_code_is_refused(tmp_path):
    marker = tmp_path / "code_ran"
    checkpoint = tmp_path / "stage1.ckpt"
    torch.save({"state_dict": {"student.cls_token": RunsCode(marker)}}, checkpoint)
    module = tiny_module()
    with pytest.raises(ValueError, match="model.init_from: .* cannot be read as a checkpoint"):
        module.load_student_weights(str(checkpoint))
    with pytest.raises(Exception, match="Weights only load failed"):
        CPEViT(
            model="vit_tiny_patch16_224",
            checkpoint=str(checkpoint),
            model_kwargs=dict(depth=1, embed_dim=32, num_heads=2),
        )
    assert not marker.exists()
