"""Packed variable-resolution forwards: one student forward over several
resolutions' images equals one forward per resolution, outputs and gradients (float32, CPU)."""

import pytest
import torch

from radio_lit.students import CPEViT
from radio_lit.students.attention_kernels import available_kernels, choose_kernel

# C-RADIOv4 stage 1's two partitions on one rank, shrunk: a low-res batch of several images
# and a high-res one of fewer, plus an aspect ratio no partition has.
BATCHES = [(3, 32, 32), (1, 64, 64), (2, 48, 32)]


def tiny_student(**kwargs) -> CPEViT:
    args = dict(
        model="vit_tiny_patch16_224",
        max_resolution=256,
        num_cls_tokens=2,
        num_registers=3,
        model_kwargs=dict(depth=4, embed_dim=32, num_heads=2),
        cpe_dropout=0.3,
    )
    args.update(kwargs)
    return CPEViT(**args).double().float()


def _views(seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(b, 3, h, w, generator=gen, requires_grad=True) for b, h, w in BATCHES]


def _loss(outputs) -> torch.Tensor:
    # Weights that differ per token, so that a wrong token order cannot cancel out.
    total = torch.zeros(())
    for out in outputs:
        for t in (out.summary, out.features):
            total = total + (t * torch.linspace(-1, 1, t.numel()).reshape(t.shape)).sum()
    return total


def _run(student, views, packed, kernel="sdpa_mask", seed=7):
    torch.manual_seed(seed)  # the CPE windows, dropout and ViTDet draws
    outputs = student(views, kernel) if packed else [student(v) for v in views]
    student.zero_grad()
    _loss(outputs).backward()
    grads = {n: p.grad.clone() for n, p in student.named_parameters() if p.grad is not None}
    inputs = [v.grad.clone() for v in views]
    for v in views:
        v.grad = None
    return outputs, grads, inputs


def _close(a, b, rel=1e-5):
    scale = b.abs().max().clamp_min(1e-12)
    assert ((a - b).abs().max() / scale) <= rel, float((a - b).abs().max() / scale)


@pytest.mark.parametrize(
    ("options", "kernel"),
    [
        (dict(), "sdpa_mask"),  # training: random CPE windows and dropout per image
        (dict(vitdet_window_sizes=[2], vitdet_num_windowed=1), "sdpa_mask"),  # prefix aside
        (dict(), "padded"),
    ],
    ids=["cpe", "vitdet", "padded"],
)
@pytest.mark.filterwarnings("ignore:ViTDet window sizes")  # 48x32 px: 3x2 patches, untiled
def test_packed_equals_one_forward_per_resolution(options, kernel):
    torch.manual_seed(0)
    student = tiny_student(**options).train()
    views = _views()
    per_res, grads, inputs = _run(student, views, packed=False)
    packed, packed_grads, packed_inputs = _run(student, views, packed=True, kernel=kernel)
    for a, b in zip(packed, per_res, strict=True):
        assert a.summary.shape == b.summary.shape and a.features.shape == b.features.shape
        _close(a.summary, b.summary)
        _close(a.features, b.features)
    assert packed_grads.keys() == grads.keys() and "pos_embed" in grads
    for name in grads:
        _close(packed_grads[name], grads[name])
    for a, b in zip(packed_inputs, inputs, strict=True):
        _close(a, b)


def test_flex_forward_equals_one_forward_per_resolution():
    """FlexAttention eager (torch has no CPU backward for it: forward only here)."""
    student = tiny_student().eval()
    views = [v.detach() for v in _views()]
    with torch.no_grad():
        per_res = [student(v) for v in views]
        packed = student(views, "flex")
    for a, b in zip(packed, per_res, strict=True):
        _close(a.summary, b.summary)
        _close(a.features, b.features)


def test_packing_differs_from_attention_across_images():
    """The block-diagonal mask is what keeps images apart: without it outputs change."""
    student = tiny_student().eval()
    views = [v.detach() for v in _views()]
    packed = student(views)
    with torch.no_grad():
        tokens = torch.cat([student.embed(v)[0].reshape(1, -1, 32) for v in views], dim=1)
        mixed = student.norm(student.blocks(student.norm_pre(tokens)))
    assert not torch.allclose(mixed[0, : 3 * (5 + 4)].reshape(3, 9, 32)[:, :2], packed[0].summary)


def test_kernel_choice_by_device_and_measurement():
    """CUDA proxy: the choice from a fake capability table (what a GPU build offers)."""
    cuda = frozenset({"sdpa_mask", "flex", "varlen", "padded"})
    assert choose_kernel("cpu", 80) == "sdpa_mask"
    # Unmeasured: padding, never varlen (cuDNN inside on Hopper) nor flex.
    assert choose_kernel("cuda", 80, available=cuda) == "padded"
    # KempnerForge #207's short sequences: padding measured faster than flex at head dim 72.
    measured = {72: {"flex": 0.72, "padded": 1.0, "cudnn": 9.0}, 80: {"varlen": 2.0, "flex": 2.3}}
    assert choose_kernel("cuda", 72, measured=measured, available=cuda) == "padded"
    assert choose_kernel("cuda", 80, measured=measured, available=cuda) == "flex"
    assert choose_kernel("cuda", 64, measured=measured, available=cuda) == "padded"
    assert choose_kernel("cuda", 80, override="padded", available=cuda) == "padded"
    with pytest.raises(ValueError, match="not available on cpu"):
        choose_kernel("cpu", 64, override="varlen")
    with pytest.raises(ValueError, match="unknown packed attention kernel 'cudnn'"):
        choose_kernel("cuda", 64, override="cudnn", available=cuda)
    assert "varlen" not in available_kernels("cpu")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("kernel", ["varlen", "flex", "padded", "sdpa_mask"])
def test_packed_equals_per_resolution_on_cuda(kernel):
    torch.manual_seed(0)
    student = tiny_student(model_kwargs=dict(depth=2, embed_dim=160, num_heads=2)).cuda().eval()
    views = [v.detach().cuda() for v in _views()]
    with torch.autocast("cuda", torch.bfloat16):
        per_res = [student(v) for v in views]
        packed = student(views, kernel)
    for a, b in zip(packed, per_res, strict=True):
        _close(a.features.float(), b.features.float(), rel=3e-2)


def test_student_step_packs_a_ranks_partitions_into_one_forward(capsys):
    """``model.student_packing`` through StudentStep: two partitions' chunks (as a rank of
    the balanced layout runs them) in one forward give each chunk its own outputs, equal to
    one forward per chunk, with this rank's forward stream (CPE windows, dropout)."""
    from radio_lit.students.conditioner import StudentConditioner
    from radio_lit.students.packing import StudentPacking
    from radio_lit.training.partitions import Chunk
    from radio_lit.training.student_step import StudentStep

    student = tiny_student().train()
    chunks = [
        Chunk("low_res", torch.rand(3, 3, 64, 64), ("clip",), (32, 32), 1.0),
        Chunk("high_res", torch.rand(1, 3, 64, 64), ("clip",), (64, 48), 1.0),
    ]
    outputs = {}
    for packing in (None, StudentPacking()):
        step = StudentStep(
            16, (32, 32), StudentConditioner((0.5,) * 3, (0.25,) * 3), packing=packing
        )
        step.begin(student, step=3, rank=1)
        outputs[packing is None] = step.forward(student, chunks, training=True)
    assert "packed student attention: sdpa_mask (chosen by device and head dim: cpu, 16)" in (
        capsys.readouterr().out
    )
    for a, b in zip(outputs[False], outputs[True], strict=True):
        assert a.features.shape == b.features.shape
        _close(a.features, b.features)
        _close(a.summary, b.summary)
