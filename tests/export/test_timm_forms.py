"""Every RADIO family timm publishes, in both of timm's forms, imported exactly at step 0
(<= 1e-5 relative) by ``PublishedStudent`` + ``model.init_from`` from a timm folder
(``save_for_hf``): ``vit_*_radio_v3`` (C-RADIOv3-B/L/H/g) and ``vit_*_radio_v4`` (C-RADIOv4
SO400M/H), exact at the folder's ``img_size`` (timm resizes the grid for its own input size
there: its docstrings send RADIO's behaviour at other sizes to naflexvit), and
``naflexvit_*_radio_*`` (``embeds.*``: a linear patch embedding with the channels fastest,
the whole 128 x 128 grid, resized aspect-preserving as RADIO's CPE), exact at any size, with
``align_corners`` as timm's class resizes (C-RADIOv3-B and -H: ``True``, as released;
``timm.models.vision_transformer._RADIO_ALIGN_CORNERS``)."""

from __future__ import annotations

import pytest
import timm
import torch
from timm.models import save_for_hf

from radio_lit.data.views import normalize_view
from radio_lit.export import PublishedStudent
from tests.builders import tiny_dinov2_teacher, tiny_module
from tests.export.test_init_from_published import relative
from tests.export.test_init_from_sources import randomized

FAMILIES = [
    *(f"{size}_patch16_radio_v3" for size in ("base", "large", "huge", "giant")),
    *(f"{size}_patch16_radio_v4" for size in ("so400m", "huge")),
]
#: timm's C-RADIOv3 classes resizing with align_corners=True (as released).
ALIGNED = {"base_patch16_radio_v3", "huge_patch16_radio_v3"}
TINY = {"depth": 2, "embed_dim": 32, "num_heads": 2, "img_size": 64}


@pytest.mark.parametrize("form", ["vit", "naflexvit"])
@pytest.mark.parametrize("family", FAMILIES)
def test_a_timm_radio_folder_imports_exactly(tmp_path, family, form):
    name = f"{form}_{family}"
    source = randomized(timm.create_model(name, **TINY), FAMILIES.index(family))
    save_for_hf(source, tmp_path, model_args=TINY)
    torch.manual_seed(0)
    student = PublishedStudent(str(tmp_path), spectral_reparam=False)
    module = tiny_module(student=student, teachers={"dino": tiny_dinov2_teacher()},
                         student_resolution=64, init_from=str(tmp_path)).eval()  # fmt: skip
    assert student.cpe_align_corners == (form == "naflexvit" and family in ALIGNED)
    assert module.conditioner.values[0] == pytest.approx(source.pretrained_cfg["mean"])
    prefix = source.num_prefix_tokens  # timm: one class token, the rest registers
    sizes = [(64, 64), (48, 80)] if form == "naflexvit" else [(64, 64)]
    for size in sizes:
        images = torch.rand(2, 3, *size, generator=torch.Generator().manual_seed(1))
        with torch.no_grad():
            tokens = source.forward_features(normalize_view(images, *module.conditioner.values))
            out = module.student(normalize_view(images, *module.conditioner.values))
        want = torch.cat([tokens[:, :1], tokens[:, prefix:]], dim=1)
        got = torch.cat([out.summary, out.features.flatten(1, 2)], dim=1)
        assert relative(got, want) <= 1e-5, (name, size)


def test_a_student_resizing_otherwise_than_the_folder_is_refused(tmp_path):
    source = timm.create_model("naflexvit_base_patch16_radio_v3", **TINY)
    save_for_hf(source, tmp_path, model_args=TINY)
    student = PublishedStudent(str(tmp_path), spectral_reparam=False, cpe_min_scale=0.5)
    student.cpe_align_corners = False  # as a hand-written student config would have it
    with pytest.raises(ValueError, match="cpe_align_corners: true"):
        tiny_module(student=student, teachers={"dino": tiny_dinov2_teacher()},
                    student_resolution=64, init_from=str(tmp_path))  # fmt: skip
