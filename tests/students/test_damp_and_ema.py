"""DAMP weight noise (report 2.4; Trinh et al. 2024), the EMA student and shift-equivariant
MESA (report 2.3.2), as the papers define them."""

from __future__ import annotations

import copy
from collections import Counter
from contextlib import nullcontext
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from radio_lit.geometry.shifts import PatchShifts
from radio_lit.students.damp import DAMP
from radio_lit.students.ema import MESA, EMAStudent, mesa_loss
from radio_lit.students.spectral_reparam import SpectralLinear
from tests.builders import cpu_trainer, image_batches, tiny_module, tiny_student


@pytest.mark.parametrize("layer_type", ["linear", "spectral"])
def test_damp_multiplies_each_weight_element_by_fresh_n_1_sigma2_noise(layer_type):
    """``W ⊙ ξ`` (ξ per element, a fresh draw per forward, from the global random state),
    bias untouched, on the weight the layer applies (σReparam's effective weight)."""
    torch.manual_seed(0)
    layer = nn.Linear(64, 48)
    if layer_type == "spectral":
        layer = SpectralLinear.from_linear(layer)
    x = torch.randn(5, 64)
    damp = DAMP(std=0.2)
    with damp.noise(layer):
        torch.manual_seed(1)
        noisy = layer(x)
        again = layer(x)
    torch.manual_seed(1)
    xi = torch.randn(48, 64) * 0.2 + 1.0
    weight = layer.effective_weight() if layer_type == "spectral" else layer.weight
    torch.testing.assert_close(noisy, F.linear(x, weight * xi, layer.bias))
    assert not torch.allclose(noisy, again)  # a fresh draw per forward
    torch.testing.assert_close(layer(x), F.linear(x, weight, layer.bias))  # off outside
    # ξ's statistics over a large layer: mean 1, std σ.
    big = nn.Linear(512, 512, bias=False)
    nn.init.ones_(big.weight)
    with damp.noise(big):
        samples = big(torch.eye(512)).flatten()
    assert samples.mean().item() == pytest.approx(1.0, abs=0.005)
    assert samples.std().item() == pytest.approx(0.2, abs=0.005)
    with pytest.raises(ValueError, match="model.damp.init_args.std"):
        DAMP(std=0.0)


def test_damp_is_on_in_training_forwards_only():
    module = tiny_module(damp=DAMP(std=0.3))
    crop = torch.rand(2, 3, 64, 64)
    module.eval()
    assert torch.equal(module.run_student(crop).features, module.run_student(crop).features)
    module.train()
    torch.manual_seed(0)
    first = module.run_student(crop).features
    torch.manual_seed(0)
    assert torch.equal(first, module.run_student(crop).features)  # the step's random state
    assert not torch.equal(first, module.run_student(crop).features)


def _hook_noise(damp: DAMP, module: nn.Module) -> list[torch.utils.hooks.RemovableHandle]:
    """The earlier DAMP, as reference: a forward hook that recomputed each linear layer's and
    convolution's output on ``W ⊙ ξ`` after the clean one."""

    def noisy(layer: nn.Module, inputs: tuple[Tensor, ...], output: Tensor) -> Tensor:
        effective = getattr(layer, "effective_weight", None)
        weight = effective() if callable(effective) else layer.weight
        xi = torch.randn(weight.shape, device=weight.device).mul_(damp.std).add_(1.0)
        if isinstance(layer, nn.Conv2d):
            return layer._conv_forward(inputs[0], weight * xi, layer.bias)
        return F.linear(inputs[0], weight * xi.to(weight.dtype), layer.bias)

    layers = [m for m in module.modules() if isinstance(m, (nn.Linear, nn.Conv2d))]
    return [layer.register_forward_hook(noisy) for layer in layers]


_PRODUCTS = ("aten::linear", "aten::addmm", "aten::mm", "aten::matmul", "aten::bmm")
_PRODUCTS += ("aten::conv2d",)


@pytest.mark.parametrize("spectral", [True, False])
def test_damp_runs_each_layer_once_with_the_earlier_noise(spectral):
    """A training forward with DAMP runs as many matrix products and convolutions as one
    without (each perturbed layer's once, on ``W ⊙ ξ``; σReparam's weights once per step), and
    for the same seed gives what a reference forward hook on every linear layer and the patch
    embedding gives (the same ξ, drawn in the same order), in σReparam's training step and on
    plain linear layers; gradients reach W and the scales."""
    from benchmarks.dispatch import count_operations
    from radio_lit.students.spectral_reparam import spectral_step

    torch.manual_seed(0)
    student = tiny_student(spectral_reparam=spectral).train()
    images, damp = torch.randn(2, 3, 64, 64), DAMP(std=0.2)
    start = copy.deepcopy(student.state_dict())  # each step refines σReparam's u, v

    def products(noise: Any) -> tuple[Counter[str], Tensor, list[Tensor]]:
        student.load_state_dict(start)
        student.zero_grad()
        torch.manual_seed(3)
        with spectral_step(student), noise:
            out, count = count_operations(lambda: student(images).features)
            out.square().mean().backward()
        grads = [p.grad.clone() for p in student.parameters()]
        return Counter({n: count.by_name[n] for n in _PRODUCTS}), out, grads

    clean, _, _ = products(nullcontext())
    noisy, out, grads = products(damp.noise(student))
    handles = _hook_noise(damp, student)
    try:
        hooked, expected, expected_grads = products(nullcontext())
    finally:
        for handle in handles:
            handle.remove()
    linears = sum(isinstance(m, nn.Linear) for m in student.modules())
    assert noisy == clean and noisy["aten::linear"] == linears
    assert noisy["aten::conv2d"] == 1  # the patch embedding
    assert hooked["aten::linear"] == 2 * linears  # the hook's second product per layer
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad, expected_grad)


def test_damp_perturbs_the_patch_embedding_kernel_not_biases_and_norms_on_request():
    """Notes 2.5: every linear weight and the patch embedding's kernel (a Conv2d here, a Linear
    in NVlabs' embedder), never a bias; LayerNorm scales only with ``norm_scales`` (the DAMP
    paper's rule; NVlabs' code leaves them)."""
    student = tiny_student()
    embed, norm = student.patch_embed.proj, student.blocks[0].norm1
    perturbed = [layer for layer, _ in DAMP().layers(student)]
    linears = [m for m in student.modules() if isinstance(m, nn.Linear)]
    assert perturbed == [embed, *linears]  # (σReparam's layers are Linear subclasses)
    assert norm in [layer for layer, _ in DAMP(norm_scales=True).layers(student)]
    x = torch.randn(2, 3, 32, 32)
    with DAMP(std=0.2).noise(embed):
        torch.manual_seed(1)
        noisy = embed(x)
    torch.manual_seed(1)
    xi = torch.randn(embed.weight.shape) * 0.2 + 1.0
    torch.testing.assert_close(noisy, F.conv2d(x, embed.weight * xi, embed.bias, stride=16))
    tokens = torch.randn(2, 5, norm.normalized_shape[0])
    with DAMP(std=0.2, norm_scales=True).noise(norm):
        torch.manual_seed(2)
        noisy = norm(tokens)
    torch.manual_seed(2)
    scale = norm.weight * (torch.randn(norm.weight.shape) * 0.2 + 1.0)
    expected = F.layer_norm(tokens, norm.normalized_shape, scale, norm.bias, norm.eps)
    torch.testing.assert_close(noisy, expected)


def test_a_compiled_student_keeps_one_graph_with_damp():
    """``model.compile`` with DAMP: the noisy forward is captured once, not per step."""
    from torch._dynamo.utils import counters

    from radio_lit.students.spectral_reparam import spectral_step

    torch._dynamo.reset()
    counters.clear()
    student = tiny_student().train()
    student.compile(backend="eager")
    damp = DAMP(std=0.1)
    for _ in range(3):
        with spectral_step(student), damp.noise(student):
            student(torch.randn(1, 3, 32, 32)).features.sum().backward()
    assert counters["stats"]["unique_graphs"] == 1
    assert not any(isinstance(m, nn.Linear) and "forward" in vars(m) for m in student.modules())


def test_ema_update_is_the_moving_average_and_buffers_follow():
    student, heads = nn.Linear(3, 2), nn.ModuleDict({"t": nn.Linear(2, 2)})
    student.register_buffer("state", torch.zeros(2))
    ema = EMAStudent(student, heads, decay=0.75)
    before = student.weight.detach().clone()
    with torch.no_grad():
        student.weight.add_(4.0)
        student.state.fill_(7.0)
    ema.update(student, heads)
    torch.testing.assert_close(ema.student.weight, 0.75 * before + 0.25 * (before + 4.0))
    assert ema.student.state.tolist() == [7.0, 7.0]
    assert not any(p.requires_grad for p in ema.parameters())
    assert not ema.train().training  # always in eval mode


def test_the_ema_follows_each_update_right_after_it(tmp_path):
    """One training step with decay 0.5: the EMA is halfway between the starting weights and
    the updated ones (it was the starting weights when it followed the update a step late)."""
    module = tiny_module(mesa=MESA(decay=0.5))
    start = module.student.patch_embed.proj.weight.detach().clone()
    cpu_trainer(tmp_path, max_steps=1).fit(module, image_batches())
    live = module.student.patch_embed.proj.weight.detach()
    assert not torch.equal(live, start)
    torch.testing.assert_close(module.ema.student.patch_embed.proj.weight, (start + live) / 2)


def test_mesa_is_layer_normed_mse_on_the_overlap_with_no_gradient_to_the_ema():
    generator = torch.Generator().manual_seed(0)
    crop_map = torch.randn(2, 6, 6, 8, generator=generator)
    online_shift, ema_shift = torch.tensor([[1, 0], [0, -1]]), torch.tensor([[0, 1], [-1, 0]])
    # Each view's map shows the crop's token a + k at token a (radio_lit.geometry.shifts).
    online = _shifted(crop_map * 3.0 + 1.0, online_shift).requires_grad_(True)  # LN removes
    ema = _shifted(crop_map, ema_shift).requires_grad_(True)  # affine changes per token
    loss = mesa_loss({"backbone": online}, {"backbone": ema}, online_shift, ema_shift)
    assert loss.item() == pytest.approx(0.0, abs=1e-9)
    noisy = online + torch.randn(online.shape, generator=generator)
    loss = mesa_loss({"backbone": noisy}, {"backbone": ema}, online_shift, ema_shift)
    loss.backward()
    assert loss.item() > 0.1 and online.grad is not None and ema.grad is None


def _shifted(crop_map: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """``out[b, a] = crop_map[b, a + shift[b]]`` (zeros outside)."""
    out = torch.zeros_like(crop_map)
    for b, (dy, dx) in enumerate(shift.tolist()):
        h, w = crop_map.shape[1:3]
        for i in range(h):
            for j in range(w):
                if 0 <= i + dy < h and 0 <= j + dx < w:
                    out[b, i, j] = crop_map[b, i + dy, j + dx]
    return out


def test_ema_and_mesa_train_checkpoint_and_old_checkpoints_load(tmp_path):
    module = tiny_module(
        mesa=MESA(decay=0.5, applies_to="both"), shifts=PatchShifts(), damp=DAMP(0.1)
    )
    start = module.student.patch_embed.proj.weight.detach().clone()
    cpu_trainer(tmp_path, max_steps=2).fit(module, image_batches())
    live = module.student.patch_embed.proj.weight
    ema = module.ema.student.patch_embed.proj.weight
    assert not torch.equal(ema, start) and not torch.equal(ema, live)
    state = module.state_dict()
    assert (
        "ema.student.patch_embed.proj.weight" in state
        and "ema.heads.clip.features.out.weight" in (state)
    )
    resumed = tiny_module(mesa=MESA(decay=0.5))
    resumed.load_state_dict(state)
    assert torch.equal(resumed.ema.student.patch_embed.proj.weight, ema)
    old = {k: v for k, v in state.items() if not k.startswith("ema.")}
    fresh = tiny_module(mesa=MESA())
    fresh.load_state_dict(old)  # strict; the EMA starts at the loaded weights
    assert torch.equal(fresh.ema.student.patch_embed.proj.weight, live)
    plain = tiny_module()
    plain.load_state_dict(old)  # a run without the EMA is unchanged
