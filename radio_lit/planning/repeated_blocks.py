"""Each distinct block of a step counted once, the repeats replayed (the plan's speed).

A ViT's blocks repeat: DINOv3-7B's 40 blocks run the same operations on the same shapes, as
do the student's global blocks and, among themselves, its ViTDet-windowed ones. Counting a step
on fake tensors costs the dispatch of every operation (:mod:`radio_lit.planning.counting`), so
:func:`repeated_blocks` counts each distinct *(block, inputs)* once and replays it for every
other block like it, in this step and in every later count of the same plan (other draws,
GPU counts, layouts).

**Which modules.** The children of an ``nn.ModuleList`` / ``nn.Sequential`` that share their
class with a sibling and hold submodules (the blocks of timm, open_clip, transformers,
segment-anything and the student), the outermost only.

**When two calls are alike** (the key): the block's structure (each submodule's class, its
plain attributes, parameters' and buffers' shapes, dtypes and ``requires_grad``, its hooks),
the inputs' shapes, strides, dtypes and ``requires_grad``, their non-tensor arguments,
whether autograd records, autocast's dtype, and the part counting it. Floating-point attributes
enter only as *zero or not* [choice: a rate or a scale changes no operation, a zero can switch
one off (timm's ``DropPath``)]. A call whose arguments or outputs are not tensors and plain
values, or whose output shares an input's memory, is counted in full every time.

**The record** (a *probe*: the block run once outside the step's own accounting, forward and
backward): its FLOPs and operations by part (:class:`~radio_lit.planning.counting.OpRecord`);
its forward's peak above the live bytes at its start; the bytes it keeps from forward to
backward beyond its outputs (the activations autograd saves: alive in the replay as one
buffer, freed by the replayed backward); its backward's FLOPs, operations and peak above its
start; the gradients it gives its inputs and parameters. The probe runs autocast without its
weight cache: a cast weight is then held by the graph that saves it, as it is in the step
[choice: a cast the graph does not save (a bias) is held to autocast's exit in the step, to
the block's backward in the replay].

A replay adds the record to the counter: the same FLOPs and operations, the same peak above
the live bytes, outputs, kept bytes and gradients of the same sizes; through autograd (a
``torch.autograd.Function``) where the step records a graph, so that its backward comes in the
backward's order. ``tests/planning/test_repeated_blocks.py`` checks a replayed count against a
full one on the shipped configs.
"""

from __future__ import annotations

import contextlib
import types
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

from radio_lit.planning.counting import BACKWARD, OpRecord, StepCounter

__all__ = ["BlockRecords", "repeated_blocks"]


@dataclass(frozen=True)
class _Meta:
    """A tensor's shape, strides and dtype: what a replay allocates."""

    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype

    @classmethod
    def of(cls, tensor: Tensor) -> _Meta:
        return cls(tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)

    def empty(self, like: Tensor) -> Tensor:
        """A tensor of this metadata made as ``like`` is (a fake tensor: a fake one)."""
        return like.new_empty_strided(self.shape, self.stride, dtype=self.dtype)


@dataclass
class _Delta:
    """What a stretch of operations added to a :class:`StepCounter`."""

    flops: Counter[str]
    ops: OpRecord
    rise: int  # its peak above the live bytes at its start

    def replay(self, counter: StepCounter) -> None:
        counter.flops.update(self.flops)
        for name in ("gemms", "attention", "moved", "calls"):
            getattr(counter.ops, name).update(getattr(self.ops, name))
        counter.peak = max(counter.peak, counter.current + self.rise)


@dataclass
class _Record:
    """One distinct block call (module docstring)."""

    forward: _Delta
    outputs: list[_Meta | Any]  # each output leaf: a tensor's metadata or the value itself
    spec: Any  # the outputs' tree
    kept: int  # bytes kept from forward to backward beyond the outputs
    backward: _Delta | None = None
    locators: list[tuple[str, Any]] = field(default_factory=list)  # its differentiable reads
    gradients: tuple[_Meta | None, ...] = ()  # of each read
    held: list[int] = field(default_factory=list)  # the reads the graph saves (by position)


@contextlib.contextmanager
def _measured(counter: StepCounter) -> Iterator[_Delta]:
    """The counter's FLOPs and operations inside the context, kept apart from its own; its peak
    above the live bytes at the start (the counter's own peak restored)."""
    flops, ops, peak = counter.flops, counter.ops, counter.peak
    delta = _Delta(Counter(), OpRecord(), 0)
    counter.flops, counter.ops, counter.peak = delta.flops, delta.ops, counter.current
    start = counter.current
    try:
        yield delta
    finally:
        delta.rise = counter.peak - start
        counter.flops, counter.ops, counter.peak = flops, ops, peak


@contextlib.contextmanager
def _uncounted(counter: StepCounter) -> Iterator[None]:
    """Operations dispatched inside are not the step's (their count is taken back)."""
    calls = Counter(counter.ops.calls)
    try:
        yield
    finally:
        counter.ops.calls = calls


def _cut(tensor: Tensor) -> Tensor:
    """``tensor``'s stand-in in a probe: the same memory, no history."""
    return tensor.detach().requires_grad_(tensor.requires_grad)


def _plain(value: Any) -> Any:
    """A hashable stand-in for an attribute or argument that does not change the operations'
    shapes beyond what it says (module docstring); ``TypeError`` for anything else."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str, torch.dtype)):
        return value
    if isinstance(value, float):
        return ("float", value == 0.0)
    if isinstance(value, (tuple, list)):
        return (type(value).__name__, tuple(_plain(v) for v in value))
    if isinstance(value, types.MethodType):  # a forward set on an instance (DAMP's)
        return ("method", value.__func__)
    if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, type, torch.device)):
        return value
    raise TypeError(type(value).__name__)


def _structure(block: nn.Module) -> tuple:
    """The block's key part (module docstring)."""
    parts = []
    for name, module in block.named_modules():
        attributes = []
        for key, value in sorted(vars(module).items()):
            if key.startswith("_") or isinstance(value, (Tensor, nn.Module, _Replayed)):
                continue
            try:
                attributes.append((key, _plain(value)))
            except TypeError:
                attributes.append((key, type(value)))  # an object: its type [choice]
        tensors = tuple(
            (kind, key, tuple(t.shape), t.dtype, t.requires_grad)
            for kind in ("_parameters", "_buffers")
            for key, t in getattr(module, kind).items()
            if t is not None
        )
        hooks = tuple(
            len(getattr(module, h))
            for h in ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks")
        )
        parts.append((name, type(module), tuple(attributes), tensors, hooks))
    return tuple(parts)


def _tensor_key(tensor: Tensor) -> tuple:
    return (tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, tensor.requires_grad)


class BlockRecords:
    """The records of one plan's distinct block calls, kept across its counts."""

    def __init__(self) -> None:
        self.records: dict[tuple, _Record | None] = {}  # None: counted in full every time
        self.probes = self.replays = 0

    def replaying(self, module: nn.Module, counter: StepCounter) -> Any:
        """:func:`repeated_blocks` of ``module`` under ``counter`` with these records (what
        :func:`~radio_lit.planning.counting.count_step` enters)."""
        return repeated_blocks(module, counter, self)


class _Replayed:
    """A block's forward that replays its record (module docstring)."""

    def __init__(
        self, block: nn.Module, forward: Any, records: BlockRecords, counter: StepCounter
    ) -> None:
        self.block, self.forward, self.records, self.counter = block, forward, records, counter

    def key(self, leaves: list[Any], spec: Any) -> tuple | None:
        device = next((t.device.type for t in leaves if isinstance(t, Tensor)), "cpu")
        try:
            arguments = tuple(
                _tensor_key(t) if isinstance(t, Tensor) else _plain(t) for t in leaves
            )
        except TypeError:
            return None
        autocast = torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device)
        return (
            _structure(self.block),
            arguments,
            str(spec),
            torch.is_grad_enabled(),
            autocast,
            self.counter.current_part,
        )

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, spec = tree_flatten((args, kwargs))
        with _uncounted(self.counter):  # the key's queries (a fake tensor's device) are ours
            key = self.key(leaves, spec)
        if key is None:
            return self.forward(*args, **kwargs)
        if key not in self.records.records:
            self.records.records[key] = self.probe(leaves, spec)
            self.records.probes += 1
        record = self.records.records[key]
        if record is None:
            return self.forward(*args, **kwargs)
        self.records.replays += 1
        return self.replay(record, leaves)

    def _step_weights(self) -> dict[str, Tensor]:
        """σReparam's step weights of the block's layers (``{layer name: [out, in]}``),
        requested as the step's first forward requests them
        (:func:`~radio_lit.students.spectral_reparam.spectral_step`: every layer's together, at
        the first request): made outside the block, they are its reads, not its work."""
        return {
            name: module.effective_weight()
            for name, module in self.block.named_modules()
            if module.training and getattr(module, "current_step", None) is not None
        }

    def _reads(self, locators: list[tuple[str, Any]], leaves: list[Any]) -> list[Tensor]:
        """The tensors the record's ``locators`` name in this call."""
        steps = self._step_weights() if any(k == "step weight" for k, _ in locators) else {}
        found = []
        for kind, where in locators:
            if kind == "argument":
                found.append(leaves[where])
            elif kind == "parameter":
                found.append(self.block.get_parameter(where))
            else:
                found.append(steps[where])
        return found

    def probe(self, leaves: list[Any], spec: Any) -> _Record | None:
        """Run the block once, apart from the step's accounting (module docstring), on
        stand-ins of its inputs and step weights cut from the step's graph (its backward stops
        there), each noted with where it comes from."""
        places: dict[int, tuple[str, Any]] = {}
        with _uncounted(self.counter):
            storages = {
                id(t.untyped_storage()) for t in leaves if isinstance(t, Tensor) and t.numel()
            }
            device = next((t.device.type for t in leaves if isinstance(t, Tensor)), "cpu")
            cut = [_cut(t) if isinstance(t, Tensor) else t for t in leaves]
        weights = self._step_weights()  # the step's work where the first request makes them
        with _uncounted(self.counter):
            steps = {name: _cut(w) for name, w in weights.items()}
        places.update({id(t): ("argument", i) for i, t in enumerate(cut) if isinstance(t, Tensor)})
        places.update({id(p): ("parameter", n) for n, p in self.block.named_parameters()})
        places.update({id(w): ("step weight", name) for name, w in steps.items()})
        args, kwargs = tree_unflatten(cut, spec)
        uncached = (
            torch.autocast(device, torch.get_autocast_dtype(device), cache_enabled=False)
            if torch.is_autocast_enabled(device)
            else contextlib.nullcontext()
        )
        start = self.counter.current
        saved: set[int] = set()

        def pack(tensor: Tensor) -> Tensor:
            saved.add(id(tensor))
            return tensor

        with (
            _measured(self.counter) as forward,
            uncached,
            _Reads() as reads,
            torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor),
            contextlib.ExitStack() as stack,
        ):
            for name, weight in steps.items():
                layer = self.block.get_submodule(name)
                stack.enter_context(
                    mock.patch.object(layer, "effective_weight", lambda w=weight: w)
                )
            out = self.forward(*args, **kwargs)
        out_leaves, out_spec = tree_flatten(out)
        tensors = [t for t in out_leaves if isinstance(t, Tensor)]
        try:
            [_plain(v) for v in out_leaves if not isinstance(v, Tensor)]
        except TypeError:
            return None
        if any(id(t.untyped_storage()) in storages for t in tensors) or len(
            {id(t.untyped_storage()) for t in tensors}
        ) < len(tensors):
            return None  # an output sharing memory: an alias a replay cannot make
        outputs_bytes = sum(t.untyped_storage().nbytes() for t in tensors)
        record = _Record(
            forward=forward,
            outputs=[_Meta.of(v) if isinstance(v, Tensor) else v for v in out_leaves],
            spec=out_spec,
            kept=max(self.counter.current - start - outputs_bytes, 0),
        )
        wanted = [t for t in tensors if t.requires_grad]
        if not reads.read or not wanted:
            return record if not wanted else None
        locators = [places.get(id(t)) for t in reads.read.values()]
        if None in locators:
            return None  # a read from elsewhere: counted in full every time
        with _uncounted(self.counter):  # the gradients a step's backward brings
            seeds = [torch.empty_like(t) for t in wanted]
        with (
            _measured(self.counter) as backward,
            self.counter.part(BACKWARD),
            torch.autocast(device, enabled=False),  # the step's backward runs outside autocast
        ):
            gradients = torch.autograd.grad(
                wanted, list(reads.read.values()), seeds, allow_unused=True
            )
        record.backward, record.locators = backward, locators
        record.held = [i for i, t in enumerate(reads.read.values()) if id(t) in saved]
        record.gradients = tuple(None if g is None else _Meta.of(g) for g in gradients)
        record.backward.ops.calls[BACKWARD] -= self._replay_calls(record, list(reads.read.values()))
        return record

    def _replay_calls(self, record: _Record, reads: list[Tensor]) -> int:
        """The operations autograd itself dispatches around a replay's backward (checks of its
        gradients: the probe's ``autograd.grad`` made them around the block's too), taken
        from the record so that a replay in the step dispatches the block's count."""
        empty = _Record(_Delta(Counter(), OpRecord(), 0), record.outputs, record.spec, 0)
        empty.backward, empty.gradients = _Delta(Counter(), OpRecord(), 0), record.gradients
        with _measured(self.counter) as live, self.counter.part(BACKWARD):
            like = reads[0]
            outputs = _ReplayFunction.apply(self.counter, empty, like, *reads)
            wanted = [t for t in outputs if isinstance(t, Tensor) and t.requires_grad]
            with _uncounted(self.counter):
                seeds = [torch.empty_like(t) for t in wanted]
            torch.autograd.grad(wanted, reads, seeds, allow_unused=True)
        return live.ops.calls[BACKWARD]

    def replay(self, record: _Record, leaves: list[Any]) -> Any:
        record.forward.replay(self.counter)
        with _uncounted(self.counter):  # the replay's own dispatches are not the step's
            like = next(t for t in [*leaves, *self.block.parameters()] if isinstance(t, Tensor))
            if record.backward is None:
                return tree_unflatten(_made(record.outputs, like), record.spec)
            reads = self._reads(record.locators, leaves)
            outputs = _ReplayFunction.apply(self.counter, record, like, *reads)
        return tree_unflatten(list(outputs), record.spec)


class _Reads(TorchFunctionMode):
    """The differentiable tensors a stretch of code reads that it did not make."""

    def __init__(self) -> None:
        super().__init__()
        self.made: set[int] = set()
        self.read: dict[int, Tensor] = {}

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        for t in tree_leaves((args, kwargs)):
            if isinstance(t, Tensor) and t.requires_grad and id(t) not in self.made:
                self.read.setdefault(id(t), t)
        out = func(*args, **kwargs)
        self.made.update(id(t) for t in tree_leaves(out) if isinstance(t, Tensor))
        return out


def _made(leaves: list[_Meta | Any], like: Tensor) -> list[Any]:
    """``leaves`` with each tensor's metadata made a tensor as ``like`` is."""
    return [m.empty(like) if isinstance(m, _Meta) else m for m in leaves]


class _ReplayFunction(torch.autograd.Function):
    """A replayed block in the graph: its outputs and the bytes it keeps to its backward; in
    the backward, its record's backward and the gradients of its reads (module docstring)."""

    @staticmethod
    def forward(  # noqa: ANN205
        ctx: Any, counter: StepCounter, record: _Record, like: Tensor, *reads: Tensor
    ):
        ctx.counter, ctx.record = counter, record
        ctx.kept = _Meta((record.kept,), (1,), torch.uint8).empty(like)
        ctx.held = [reads[i] for i in record.held]  # the inputs the graph saves
        outputs = _made(record.outputs, like)
        integral = [t for t in outputs if isinstance(t, Tensor) and not t.is_floating_point()]
        ctx.mark_non_differentiable(*integral)
        return tuple(outputs)

    @staticmethod
    def backward(ctx: Any, *seeds: Tensor) -> tuple[Tensor | None, ...]:
        ctx.record.backward.replay(ctx.counter)
        with _uncounted(ctx.counter):
            del ctx.kept, ctx.held  # the saved activations freed
            like = next(t for t in seeds if t is not None)
            gradients = _made(list(ctx.record.gradients), like)
        return (None, None, None, *gradients)


def _blocks(module: nn.Module) -> Iterator[nn.Module]:
    """The outermost repeated blocks under ``module`` (module docstring)."""
    for child in module.children():
        if isinstance(child, (nn.ModuleList, nn.Sequential)):
            kinds = Counter(type(c) for c in child)
            repeated = [c for c in child if kinds[type(c)] > 1 and next(c.children(), None)]
            yield from repeated
            for c in child:
                if c not in repeated:
                    yield from _blocks(c)
        else:
            yield from _blocks(child)


@contextlib.contextmanager
def repeated_blocks(
    module: nn.Module, counter: StepCounter, records: BlockRecords
) -> Iterator[None]:
    """Inside the context each repeated block of ``module`` (module docstring) is counted once
    per distinct call and replayed after, its records kept in ``records`` (one per plan)."""
    blocks = list(dict.fromkeys(_blocks(module)))
    own = [vars(block).get("forward") for block in blocks]  # a forward set on the instance
    for block in blocks:
        block.forward = _Replayed(block, block.forward, records, counter)
    try:
        yield
    finally:
        for block, forward in zip(blocks, own, strict=True):
            del block.forward
            if forward is not None:
                block.forward = forward
