"""LAMB's compiled update (radio_lit.training.lamb): timm's ``Lamb`` numbers, timm's state dict,
one compilation for a whole scheduled run, and the eager step where inductor cannot compile."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import timm.optim
import torch
from torch._dynamo.utils import counters
from torch.optim.lr_scheduler import LambdaLR

from radio_lit.training.lamb import Lamb
from radio_lit.training.optim import fastest_implementation, warmup_cosine
from tests.distributed.gloo import run_gloo_workers

SHAPES = [(6, 4), (4,), (5, 3), (3,), (2, 2)]
SETTINGS = dict(lr=1e-2, weight_decay=0.02, max_grad_norm=1.0)


def groups(params: list[torch.nn.Parameter]) -> list[dict]:
    """Decayed and not decayed groups, as parameter_groups makes them (trunk, then heads)."""
    no_decay = {"weight_decay": 0.0}
    return [
        {"params": params[:1], "name": "trunk_decay"},
        {"params": params[1:2], "name": "trunk_no_decay", **no_decay},
        {"params": params[2:3], "name": "heads_decay"},
        {"params": params[3:], "name": "heads_no_decay", **no_decay},
    ]


def parameters(shapes: list[tuple[int, ...]] = SHAPES) -> list[torch.nn.Parameter]:
    generator = torch.Generator().manual_seed(0)
    return [torch.nn.Parameter(torch.randn(s, generator=generator)) for s in shapes]


def gradients(steps: int, shapes: list[tuple[int, ...]] = SHAPES) -> list[list[torch.Tensor]]:
    """Each step's gradients, of global norm ~10 (LAMB's max_grad_norm 1 clips them)."""
    generator = torch.Generator().manual_seed(1)
    return [[3 * torch.randn(s, generator=generator) for s in shapes] for _ in range(steps)]


def take(params: list[torch.nn.Parameter], grads: list[torch.Tensor], frozen: bool) -> None:
    """Set the gradients; a frozen trunk (FreezeBody's) has none."""
    for index, (param, grad) in enumerate(zip(params, grads, strict=True)):
        param.grad = None if frozen and index < 2 else grad.clone()


def test_the_compiled_update_is_timms_and_the_schedule_never_recompiles():
    """Ten steps under a warm-up then cosine LambdaLR, the trunk without gradients for the
    first three (its groups skipped), clipping on: the parameters equal timm's eager ``Lamb``'s
    after every step, the state dicts have the same keys and step counters, and dynamo compiles
    nothing after the first step of each set of groups (the LR and step count are tensors)."""
    sides = []
    for optimizer in (timm.optim.Lamb, Lamb):
        params = parameters()
        extra = {"compiled": True} if optimizer is Lamb else {"foreach": True}
        built = optimizer(groups(params), **SETTINGS, **extra)
        schedule = LambdaLR(built, lambda step: warmup_cosine(step, 3, 10, 0.1))
        sides.append((params, built, schedule))
    compiled = sides[1][1]
    frames, lrs = [], []
    for step, grads in enumerate(gradients(10)):
        for params, optimizer, schedule in sides:
            take(params, grads, frozen=step < 3)
            if step == 0:
                assert optimizer._get_clip_grad_norm() > 1  # clipping is exercised
            optimizer.step()
            schedule.step()
        frames.append(counters["frames"]["total"])
        lrs.append(compiled.param_groups[0]["lr"])
        for eager_param, compiled_param in zip(sides[0][0], sides[1][0], strict=True):
            torch.testing.assert_close(compiled_param, eager_param, rtol=1e-5, atol=1e-6)
    assert len(set(lrs)) == 9  # the schedule moved the LR (1.0 twice: warm-up's end)
    assert frames[1:3] == [frames[0]] * 2 and frames[4:] == [frames[3]] * 6, frames
    eager_state, compiled_state = sides[0][1].state_dict(), sides[1][1].state_dict()
    assert compiled_state["param_groups"] == eager_state["param_groups"]
    assert compiled_state["state"].keys() == eager_state["state"].keys()
    assert all(s.keys() == {"exp_avg", "exp_avg_sq"} for s in compiled_state["state"].values())


def test_a_checkpoint_moves_between_the_eager_and_the_compiled_step():
    """Three eager steps, a state dict loaded by the compiled optimizer, two compiled steps,
    its state dict loaded by timm's eager ``Lamb``, one more step: the run of one eager
    optimizer, to float tolerance."""
    grads = gradients(6)
    reference = parameters()
    eager = timm.optim.Lamb(groups(reference), **SETTINGS, foreach=True)
    for step_grads in grads:
        take(reference, step_grads, frozen=False)
        eager.step()
    params = parameters()
    chain = [
        (timm.optim.Lamb(groups(params), **SETTINGS, foreach=True), grads[:3]),
        (Lamb(groups(params), **SETTINGS, compiled=True), grads[3:5]),
        (timm.optim.Lamb(groups(params), **SETTINGS, foreach=True), grads[5:]),
    ]
    state = None
    for optimizer, run in chain:
        if state is not None:
            optimizer.load_state_dict(state)
        for step_grads in run:
            take(params, step_grads, frozen=False)
            optimizer.step()
        state = optimizer.state_dict()
    assert [g["step"].item() for g in state["param_groups"]] == [6.0] * 4
    for want, got in zip(reference, params, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_where_inductor_cannot_compile_the_eager_step_runs_after_one_warning(monkeypatch):
    """No C++ compiler (inductor's own error, raised where it compiles): one warning naming the
    reason, timm's update at that step and the next ones, nothing raised."""
    import torch._inductor.compile_fx
    from torch._inductor.exc import InvalidCxxCompiler

    def no_compiler(*args, **kwargs):
        raise InvalidCxxCompiler()

    monkeypatch.setattr(torch._inductor.compile_fx, "compile_fx", no_compiler)
    shapes = [(7, 2), (2,), (3, 3), (3,), (1, 5)]  # compiled by no other test: not cached
    reference, params = parameters(shapes), parameters(shapes)
    eager = timm.optim.Lamb(groups(reference), **SETTINGS, foreach=True)
    compiled = Lamb(groups(params), **SETTINGS, compiled=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for step_grads in gradients(3, shapes):
            take(reference, step_grads, frozen=False)
            take(params, step_grads, frozen=False)
            eager.step()
            compiled.step()
    messages = [str(w.message) for w in caught if "LAMB" in str(w.message)]
    assert len(messages) == 1, messages
    assert "could not be compiled (InvalidCxxCompiler: No working C++ compiler" in messages[0]
    assert compiled.compiled is False and "\n" not in messages[0]
    for want, got in zip(reference, params, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_timms_lamb_gets_the_compiled_update_where_that_is_faster():
    """The policy: the configs' ``timm.optim.Lamb`` becomes radio-lit's with the same settings
    and groups, multi-tensor unless the config said otherwise, eager on CPU parameters (the
    compilation costs more than a CPU run gains); radio-lit's is left as the config made it."""
    built = fastest_implementation(timm.optim.Lamb(groups(parameters()), **SETTINGS))
    assert type(built) is Lamb and built.compiled is None and not built.compiles()
    assert {g["foreach"] for g in built.param_groups} == {True}
    assert [g["weight_decay"] for g in built.param_groups] == [0.02, 0.0, 0.02, 0.0]
    assert built.defaults["max_grad_norm"] == 1.0 and built.defaults["lr"] == 1e-2
    loop = fastest_implementation(timm.optim.Lamb(groups(parameters()), foreach=False))
    assert {g["foreach"] for g in loop.param_groups} == {False}
    chosen = Lamb(groups(parameters()), compiled=False)
    assert fastest_implementation(chosen) is chosen


@pytest.mark.distributed
def test_the_compiled_update_of_fsdp2_shards_is_timms(tmp_path):
    """FSDP2's ``DTensor`` parameters on 2 gloo ranks: the compiled update (its norms reduced
    across ranks inside the graph) equals timm's eager one on every rank's shards."""
    worker = Path(__file__).with_name("compiled_lamb_worker.py")
    for result in run_gloo_workers(worker, tmp_path, world_size=2):
        assert result["kinds"] == ["DTensor"]
        assert result["compiled_frames"] >= 1  # it did compile
        assert result["max_difference"] < 1e-6
        assert result["moved"]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_cuda_the_update_compiles_by_default_and_equals_timms():
    """CUDA parameters: compiled by default, timm's numbers over a scheduled run, no
    compilation after the first step."""
    sides = []
    for optimizer in (timm.optim.Lamb, Lamb):
        params = [torch.nn.Parameter(p.detach().cuda()) for p in parameters()]
        built = fastest_implementation(optimizer(groups(params), **SETTINGS))
        schedule = LambdaLR(built, lambda step: warmup_cosine(step, 3, 10, 0.1))
        sides.append((params, built, schedule))
    assert type(sides[0][1]) is Lamb and sides[0][1].compiles()
    frames = []
    for grads in gradients(6):
        for params, optimizer, schedule in sides:
            take(params, [g.cuda() for g in grads], frozen=False)
            optimizer.step()
            schedule.step()
        frames.append(counters["frames"]["total"])
    assert frames[1:] == [frames[0]] * 5, frames
    for a, b in zip(sides[0][0], sides[1][0], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)  # the same compiled update
    eager = [torch.nn.Parameter(p.detach().cuda()) for p in parameters()]
    reference = timm.optim.Lamb(groups(eager), **SETTINGS, foreach=True)
    schedule = LambdaLR(reference, lambda step: warmup_cosine(step, 3, 10, 0.1))
    for grads in gradients(6):
        take(eager, [g.cuda() for g in grads], frozen=False)
        reference.step()
        schedule.step()
    for want, got in zip(eager, sides[0][0], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
