"""Every attention of the student and the teachers goes through SDPA; SAM's
relative-position attention through SDPA with an additive mask gives segment-anything's
outputs."""

import copy

import pytest
import torch
from segment_anything.modeling import ImageEncoderViT
from segment_anything.modeling.image_encoder import Attention, Block

from benchmarks.dispatch import count_operations
from benchmarks.fake_cuda import FakeCuda
from radio_lit.teachers.sam_attention import (
    MASK_ALIGNMENT,
    SDPAAttention,
    WindowBlock,
    relative_position_bias,
    use_sdpa,
)
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
    blocks = [m for m in fast.modules() if isinstance(m, Block)]
    assert blocks and all(type(m) is WindowBlock for m in blocks)
    assert fast.state_dict().keys() == encoder.state_dict().keys()
    images = torch.randn(2, 3, 128, 128)
    torch.testing.assert_close(fast(images), encoder(images), rtol=1e-4, atol=1e-5)


def test_the_bias_rows_are_aligned_for_memory_efficient_attention_on_cuda():
    """On CUDA the bias of 3 x 3 windows (9 keys) is a view of rows padded to 16 elements, so
    PyTorch's memory-efficient attention takes it without padding a copy (fake CUDA tensors);
    its values are the same wherever it is built (checked on the CPU)."""
    torch.manual_seed(0)
    q, rel_h, rel_w = torch.randn(2, 4, 9, 8), torch.randn(5, 8), torch.randn(5, 8)
    with FakeCuda() as fake:
        with fake.mode:
            fake_q = fake.mode.from_tensor(q).to("cuda")
            bias = relative_position_bias(fake_q, rel_h.cuda(), rel_w.cuda(), (3, 3))
        assert bias.shape == (2, 4, 9, 9) and bias.stride(-2) % MASK_ALIGNMENT == 0
    along_h = torch.einsum(
        "bnhwc,hkc->bnhwk",
        q.view(2, 4, 3, 3, 8),
        rel_h[torch.arange(3)[:, None] - torch.arange(3) + 2],
    )
    along_w = torch.einsum(
        "bnhwc,wkc->bnhwk",
        q.view(2, 4, 3, 3, 8),
        rel_w[torch.arange(3)[:, None] - torch.arange(3) + 2],
    )
    expected = (along_h[..., :, None] + along_w[..., None, :]).reshape(2, 4, 9, 9)
    torch.testing.assert_close(relative_position_bias(q, rel_h, rel_w, (3, 3)), expected)


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
