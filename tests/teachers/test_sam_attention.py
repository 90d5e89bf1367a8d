"""Every attention of the student and the teachers goes through SDPA; SAM's
relative-position attention through SDPA with an additive mask gives segment-anything's
outputs."""

import copy

import pytest
import torch
from segment_anything.modeling import ImageEncoderViT
from segment_anything.modeling.image_encoder import Attention

from benchmarks.dispatch import count_operations
from radio_lit.teachers.sam_attention import SDPAAttention, use_sdpa
from tests.builders import tiny_student
from tests.teachers import tiny
from tests.teachers.tiny import TINY_SAM_ENCODER


@torch.no_grad()
def test_sdpa_attention_gives_segment_anythings_outputs():
    """Windowed and global blocks, random relative-position tables (SAM zero-initialises
    them), the padded windows of a 128 px encoder with windows of 3 tokens."""
    torch.manual_seed(0)
    encoder = ImageEncoderViT(**{**TINY_SAM_ENCODER, "window_size": 3}).eval()
    for name, param in encoder.named_parameters():
        if "rel_pos" in name:
            param.normal_()
    fast = use_sdpa(copy.deepcopy(encoder))
    attentions = [m for m in fast.modules() if isinstance(m, Attention)]
    assert attentions and all(type(m) is SDPAAttention for m in attentions)
    assert fast.state_dict().keys() == encoder.state_dict().keys()
    images = torch.randn(2, 3, 128, 128)
    torch.testing.assert_close(fast(images), encoder(images), rtol=1e-4, atol=1e-5)


SDPA = "aten::scaled_dot_product_attention"
TEACHERS = ["clip", "siglip", "dinov2", "hf_dinov2", "dinov3", "sam", "hf_siglip", "sam3"]
#: open_clip's CLIP blocks use ``nn.MultiheadAttention``; frozen (eval, no grad) it takes torch's
#: native MHA path, which on CUDA calls SDPA's flash / memory-efficient kernels when the head
#: width is a multiple of 8 (torch's ``native_multi_head_attention_cuda``), and on a CPU its
#: own matmuls and softmax.
NATIVE_MHA = {"clip"}
#: transformers' SigLIP pooling head: ``nn.MultiheadAttention`` called with its default
#: ``need_weights=True`` (upstream), so one explicit softmax of a single query's weights.
EXPLICIT_SOFTMAX = {"hf_siglip": 1}


@pytest.mark.parametrize("name", ["student", *TEACHERS])
def test_every_attention_goes_through_sdpa(name):
    """One frozen forward dispatches SDPA (or torch's fused MHA, see NATIVE_MHA) for its
    attention, and no softmax of its own (but EXPLICIT_SOFTMAX)."""
    torch.manual_seed(0)
    if name == "student":
        model, images = tiny_student().eval(), torch.randn(1, 3, 64, 64)
    else:
        model = getattr(tiny, f"tiny_{name}_teacher")()
        images = torch.rand(1, 3, model.resolution, model.resolution)
    with torch.no_grad():
        _, count = count_operations(lambda: model(images))
    names = count.by_name  # top-level operations
    fused = "aten::_native_multi_head_attention" if name in NATIVE_MHA else SDPA
    assert names[fused] > 0, names
    softmax = names["aten::softmax"] + names["aten::_softmax"]
    assert softmax == EXPLICIT_SOFTMAX.get(name, 0), names
