"""The stage recipes' LAMB (timm ``Lamb``, PHI-S table 10) takes one multi-tensor step.

timm's ``Lamb`` has a ``torch._foreach_*`` implementation, but with ``foreach=None`` picks it only
for plain CUDA tensors: on CPU, and for FSDP2's DTensors, it loops over the parameters (~14 top-
level operations per tensor). The recipes set ``foreach: true``.
"""

from copy import deepcopy
from pathlib import Path

import pytest
import torch
import yaml
from timm.optim import Lamb

from benchmarks.dispatch import count_operations
from radio_lit.students import CPEViT
from radio_lit.training.optim import parameter_groups

CONFIGS = Path(__file__).parents[2] / "configs"
LAMB_CONFIGS = sorted(p for p in CONFIGS.rglob("*.yaml") if "timm.optim.Lamb" in p.read_text())


@pytest.fixture(scope="module")
def student():
    """A 24-block ViT-L-shaped student (narrow: counts do not depend on the width)."""
    torch.manual_seed(0)
    return CPEViT(
        model="vit_large_patch16_224",
        max_resolution=128,
        model_kwargs=dict(depth=24, embed_dim=16, num_heads=2),
    )


def _with_gradients(student):
    """A copy of ``student`` with fixed gradients of global norm > 1 (LAMB clips them)."""
    copy = deepcopy(student)
    generator = torch.Generator().manual_seed(1)
    for p in copy.parameters():
        p.grad = torch.randn(p.shape, generator=generator)
    return copy


def _lamb_args(path: Path) -> dict:
    optimizer = yaml.safe_load(path.read_text())["model"]["optimizer"]
    assert optimizer["class_path"] == "timm.optim.Lamb"
    return optimizer["init_args"]


def test_the_multi_tensor_step_equals_the_per_parameter_loop_with_clipping(student):
    """Five steps of both implementations, decayed and not decayed groups, gradients clipped
    by their global norm (max_grad_norm 1): the same parameters to 1e-6."""
    steps = []
    for foreach in (False, True):
        copy = _with_gradients(student)
        groups = parameter_groups(copy.named_parameters(prefix="student"))
        optimizer = Lamb(groups, lr=1e-2, weight_decay=0.02, max_grad_norm=1.0, foreach=foreach)
        assert optimizer._get_clip_grad_norm() > 1  # the clipping is exercised
        for _ in range(5):
            optimizer.step()
        steps.append(dict(copy.named_parameters()))
    for name, value in steps[0].items():
        torch.testing.assert_close(steps[1][name], value, rtol=0, atol=1e-6, msg=name)


def test_recipes_dispatch_fewer_operations_per_step_than_parameter_tensors(student):
    """Each distinct LAMB setting of the shipped configs, one step after the first: a few dozen
    top-level operations for ~400 tensors (timm's per-parameter loop: ~14 per tensor)."""
    settings = {tuple(sorted(_lamb_args(path).items())) for path in LAMB_CONFIGS}
    assert len(LAMB_CONFIGS) >= 7 and settings
    copy = _with_gradients(student)
    tensors = sum(1 for _ in copy.parameters())
    assert tensors > 300
    for setting in settings:
        optimizer = Lamb(parameter_groups(copy.named_parameters(prefix="student")), **dict(setting))
        optimizer.step()  # state initialised
        _, count = count_operations(optimizer.step)
        assert count.top_level < tensors / 5, (setting, count, tensors)
