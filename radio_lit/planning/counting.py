"""One training step of a rank, run on fake tensors: its FLOPs by part and its memory peak.

The module is the one ``radio-lit fit`` builds (its teachers and student on the meta device:
:mod:`radio_lit.planning.meta_build`). Its parameters and buffers become *fake* tensors
(``torch._subclasses.FakeTensorMode``: shapes, dtypes and devices, no data, no computation),
as does the batch; what the step computes on the host (its shift draws, their reads) stays
real, and the step runs as a rank runs it: the views, every teacher of the rank's partitions
(their libraries' own code: timm, open_clip, transformers, segment-anything), the student's
forward with its draws (ViTDet windows, DAMP, shifts), the EMA student (MESA), the heads,
grid matching, normalizers, losses, then one backward (:func:`count_step`).

:class:`StepCounter` (a ``TorchDispatchMode`` below autograd and autocast) sees each operation
that reaches the kernels:

- **FLOPs**: PyTorch's own formulas (``torch.utils.flop_counter``'s registry, what
  ``FlopCounterMode`` counts), attributed to the part running (each teacher, its FeatSharp
  upsampler, the student's forward, each head, the EMA student, the backward, the rest);
- **memory**: every storage an operation creates is counted while it lives (a weak reference
  to the storage tells when it is freed; an output sharing an input's storage, a view or an
  in-place result, allocates nothing: ``t()`` of a weight is not a second weight), so the
  peak is that of what the step allocates beyond the weights: activations kept for the
  backward, temporaries, weights' bf16 copies made by autocast (or FSDP2's gathered weights:
  :func:`gathered_weights`), the gradients as produced [choice: torch's ``MemTracker`` cannot
  track a module whose frozen teachers hold parameters without gradients; it registers a
  gradient hook on every parameter].

Attention runs as a GPU runs it (:func:`fused_attention`): without a GPU, SDPA's backend
selection falls back to the math path, which would materialise every ``[N, N]`` score matrix.
torch's fast path of ``nn.MultiheadAttention`` (open_clip's towers under ``no_grad``) is
switched off while counting: its fused kernel has no FLOP formula; the unfused path computes
the same products.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import flop_registry

from radio_lit.students.attention_kernels import available_kernels, choose_kernel

__all__ = [
    "OpRecord",
    "StepCount",
    "StepCounter",
    "count_step",
    "fake_module",
    "fsdp2_copies",
    "fused_attention",
    "gathered_weights",
    "gpu_attention",
    "largest_draws",
    "touched_bytes",
]

#: The label of FLOPs outside every named part (views, grid matching, normalizers, losses).
OTHER = "other"
#: The label of everything the backward runs.
BACKWARD = "backward"


_aten = torch.ops.aten
#: Operations that compute nothing and allocate nothing (a device query, views): skipped by
#: :class:`StepCounter` without looking at their arguments.
_METADATA = frozenset(
    {
        torch.ops.prim.device.default,
        _aten.detach.default,
        _aten.view.default,
        _aten._unsafe_view.default,
        _aten.t.default,
        _aten.transpose.int,
        _aten.permute.default,
        _aten.expand.default,
        _aten.slice.Tensor,
        _aten.select.int,
        _aten.unsqueeze.default,
        _aten.squeeze.dim,
        _aten.as_strided.default,
        _aten.alias.default,
        _aten.split.Tensor,
        _aten.unbind.int,
    }
)


#: Matrix products priced by their ``(M, N, K)`` (:class:`OpRecord`).
_GEMMS = frozenset({_aten.mm, _aten.addmm, _aten.bmm, _aten.baddbmm})
#: Attention kernels priced by their ``(sequence, head dim)``; the value: is it a backward.
_ATTENTION = {
    _aten._scaled_dot_product_flash_attention: False,
    _aten._scaled_dot_product_efficient_attention: False,
    _aten._scaled_dot_product_cudnn_attention: False,
    _aten._scaled_dot_product_flash_attention_for_cpu: False,
    _aten._scaled_dot_product_flash_attention_backward: True,
    _aten._scaled_dot_product_efficient_attention_backward: True,
    _aten._scaled_dot_product_cudnn_attention_backward: True,
    _aten._scaled_dot_product_flash_attention_for_cpu_backward: True,
}


#: Operations that allocate memory without reading or writing it: no bytes moved (a call).
_ALLOCATING = frozenset(
    {_aten.empty, _aten.empty_like, _aten.empty_strided, _aten.new_empty, _aten.new_empty_strided}
)


def touched_bytes(tensor: Tensor) -> int:
    """Bytes of the memory ``tensor`` spans: its elements, a broadcast (stride-0) dimension
    once, at most its ``numel`` (an expanded gradient of a ``sum`` reads one value per row,
    not ``numel``; a slice reads the slice)."""
    if tensor.numel() == 0:
        return 0
    span = 1 + sum((n - 1) * abs(s) for n, s in zip(tensor.shape, tensor.stride(), strict=True))
    return min(span, tensor.numel()) * tensor.element_size()


def _dtype(tensor: Any) -> str:
    return str(tensor.dtype).removeprefix("torch.") if isinstance(tensor, Tensor) else "float32"


@dataclass
class OpRecord:
    """Each part's operations by shape, for the time model (:mod:`radio_lit.planning.time_model`).

    Attributes:
        gemms: ``{(part, M, N, K, dtype): FLOPs}``: matrix products (a batched one's batch
            folded into ``M``); a convolution or another FLOP-counted operation as the cube
            ``M = N = K`` of its FLOPs [choice: patch embeddings are a small share].
        attention: ``{(part, batch x heads, query length, key length, head dim, dtype,
            backward): FLOPs}``.
        moved: ``{part: bytes}`` the other operations read and write (inputs and outputs,
            each the memory it spans: :func:`touched_bytes`; an allocation moves none).
        calls: ``{part: operations}``, every one dispatched (the host's cost per operation).
    """

    gemms: Counter[tuple] = field(default_factory=Counter)
    attention: Counter[tuple] = field(default_factory=Counter)
    moved: Counter[str] = field(default_factory=Counter)
    calls: Counter[str] = field(default_factory=Counter)

    def record(self, part: str, func: Any, args: Any, kwargs: Any, out: Any, flops: int) -> None:
        packet = func._overloadpacket
        if packet in _GEMMS:
            a, b = (args[1], args[2]) if packet in (_aten.addmm, _aten.baddbmm) else args[:2]
            m = math.prod(a.shape[:-1])
            self.gemms[(part, m, b.shape[-1], a.shape[-1], _dtype(a))] += flops
        elif packet in _ATTENTION:
            query, key = (args[1], args[2]) if _ATTENTION[packet] else args[:2]
            heads = math.prod(query.shape[:-2])
            shape = (heads, query.shape[-2], key.shape[-2], query.shape[-1])
            self.attention[(part, *shape, _dtype(query), _ATTENTION[packet])] += flops
        elif flops:
            side = max(round((flops / 2) ** (1 / 3)), 1)
            first = next((t for t in tree_leaves(args) if isinstance(t, Tensor)), None)
            self.gemms[(part, side, side, side, _dtype(first))] += flops
        elif packet not in _ALLOCATING:
            tensors = [t for t in tree_leaves((args, kwargs, out)) if isinstance(t, Tensor)]
            self.moved[part] += sum(touched_bytes(t) for t in tensors)


class StepCounter(TorchDispatchMode):
    """FLOPs by part and live bytes (current, peak) of what runs while active (module
    docstring), and each operation's shapes (:class:`OpRecord`). Parts are entered with
    :meth:`part` (nested: the innermost counts)."""

    def __init__(self) -> None:
        super().__init__()
        self.flops: Counter[str] = Counter()
        self.ops = OpRecord()
        self.current = 0
        self.peak = 0
        self._parts = [OTHER]
        self._live: dict[int, weakref.finalize] = {}

    @property
    def current_part(self) -> str:
        """The innermost part entered (:data:`OTHER` outside every part)."""
        return self._parts[-1]

    @contextlib.contextmanager
    def part(self, name: str) -> Iterator[None]:
        self._parts.append(name)
        try:
            yield
        finally:
            self._parts.pop()

    def _freed(self, key: int, size: int) -> None:
        self._live.pop(key, None)
        self.current -= size

    def track(self, tensor: Tensor) -> None:
        """Count ``tensor``'s storage while it lives (once, however many views share it)."""
        if tensor.device.type == "meta":
            return
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._live:
            return
        size = storage.nbytes()
        self._live[key] = weakref.finalize(storage, self._freed, key, size)
        self.current += size
        self.peak = max(self.peak, self.current)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.ops.calls[self._parts[-1]] += 1
        if func in _METADATA:  # half of a step's calls: no FLOPs, no new storage
            return out
        formula = flop_registry.get(func._overloadpacket)
        flops = 0
        if formula is not None:
            flops = int(formula(*args, **kwargs, out_val=out))
            self.flops[self._parts[-1]] += flops
        self.ops.record(self._parts[-1], func, args, kwargs, out, flops)
        inputs = {
            id(t.untyped_storage())
            for t in tree_leaves((args, kwargs))
            if isinstance(t, Tensor) and t.device.type != "meta"
        }
        for tensor in tree_leaves(out):  # a view or an in-place result allocates nothing
            if isinstance(tensor, Tensor) and (
                tensor.device.type == "meta" or id(tensor.untyped_storage()) not in inputs
            ):
                self.track(tensor)
        return out


def gpu_attention(device: str) -> Any:
    """``F.scaled_dot_product_attention`` as PyTorch's CUDA composite runs it on an H100
    (:func:`fused_attention`), on tensors of any device under ``device``'s autocast."""

    def attention(
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attn_mask: Tensor | None = None,
        dropout_p: float = 0.0,
        is_causal: bool = False,
        scale: float | None = None,
        enable_gqa: bool = False,
    ) -> Tensor:
        if torch.is_autocast_enabled(device):  # SDPA is on autocast's lower-precision list
            low = torch.get_autocast_dtype(device)
            query, key, value = (t.to(low) for t in (query, key, value))
            if attn_mask is not None and attn_mask.is_floating_point():
                attn_mask = attn_mask.to(low)
        flash_dtype = query.dtype in (torch.bfloat16, torch.float16)
        if attn_mask is None and flash_dtype and query.shape[-1] <= 256:
            out = torch.ops.aten._scaled_dot_product_flash_attention(
                query, key, value, dropout_p, is_causal, False, scale=scale
            )
            return out[0]
        if attn_mask is not None:  # attention.cpp: convert_boolean_attn_mask, preprocess_mask
            if isinstance(query, FakeTensor) and not isinstance(attn_mask, FakeTensor):
                attn_mask = query.fake_mode.from_tensor(attn_mask)  # a host-made mask: shapes
            if attn_mask.dtype == torch.bool:  # an additive mask of the mask's own shape
                attn_mask = torch.zeros_like(attn_mask, dtype=query.dtype).masked_fill(
                    ~attn_mask, float("-inf")
                )
            length = attn_mask.shape[-1]  # padded to 16 elements as given, then broadcast
            if attn_mask.stride(-1) != 1 or any(s % 16 for s in attn_mask.stride()[:-1]):
                attn_mask = F.pad(attn_mask, (0, 16 - length % 16))[..., :length]
            attn_mask = attn_mask.expand(*query.shape[:-1], key.shape[-2])
        out = torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, attn_mask, False, dropout_p, is_causal, scale=scale
        )
        return out[0]

    return attention


@contextlib.contextmanager
def _no_fast_path() -> Iterator[None]:
    """torch's ``nn.MultiheadAttention`` fast path off (its fused kernel counts no FLOPs)."""
    fast = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fast)


@contextlib.contextmanager
def fused_attention(device: str = "cuda") -> Iterator[None]:
    """``F.scaled_dot_product_attention`` as PyTorch's CUDA composite runs it on an H100
    (flash attention without a mask, memory-efficient attention with one, after ``device``'s
    autocast casts and the mask's alignment padding) while the block runs, on any device:
    without a GPU its backend selection falls back to the math path, which upcasts bf16 to
    float32 and materialises the scores. (Patched on ``torch.nn.functional``, where libraries
    look it up at each call; torch's ``nn.MultiheadAttention`` fast path is off meanwhile.)"""
    with (
        _no_fast_path(),
        mock.patch.object(F, "scaled_dot_product_attention", gpu_attention(device)),
    ):
        yield


@contextlib.contextmanager
def packed_attention(module: Any, gpu: bool) -> Iterator[str | None]:
    """``model.student_packing``'s packed forward (:mod:`radio_lit.students.packing`) counted
    as the planned device runs it; yields the kernel (``None``: the run packs nothing).

    The kernel is the one :func:`~radio_lit.students.attention_kernels.choose_kernel` picks for
    a GPU (``gpu``; else for the CPU): the configured one, else the fastest of the measured
    table, else ``padded``. ``varlen`` and ``flex`` (fused, CUDA) are counted as what they
    compute, each image's own attention (unmasked SDPA per image: flash attention's FLOPs,
    ``sum_i n_i^2``, and no scores in memory); ``padded`` and ``sdpa_mask`` run as they are
    (their masks, made on the host, taken as fake tensors by :func:`gpu_attention`)."""
    from radio_lit.students import packing as packed  # the module whose names are patched

    packing = module.student_step.packing
    if packing is None:
        yield None
        return
    head_dim = module.student.blocks[0].attn.head_dim
    device = "cuda" if gpu else "cpu"
    kernel = choose_kernel(
        device, head_dim, packing.kernel, packing.measured, available_kernels(device)
    )
    run = packed.block_attention

    def attention(q: Tensor, k: Tensor, v: Tensor, lengths: Any, name: str, mask: Any) -> Tensor:
        if name not in ("varlen", "flex"):
            return run(q, k, v, lengths, name, mask)
        images = zip(*(t.split(list(lengths), dim=2) for t in (q, k, v)), strict=True)
        return torch.cat([F.scaled_dot_product_attention(*image) for image in images], dim=2)

    chosen, packing.chosen = packing.chosen, kernel
    try:
        with mock.patch.object(packed, "block_attention", attention):
            yield kernel
    finally:
        packing.chosen = chosen


@contextlib.contextmanager
def _cuda_known() -> Iterator[None]:
    """``torch.cuda.is_available()`` answered once for the step: ``FakeTensorMode`` asks it at
    every operation, and a CUDA build of torch on a machine without a GPU answers each time by
    an NVML query (a sixth of a plan's time on the 2-core CPU)."""
    available = torch.cuda.is_available()
    with mock.patch.object(torch.cuda, "is_available", lambda: available):
        yield


def fake_module(module: nn.Module, mode: Any, device: str = "cpu") -> None:
    """Replace ``module``'s parameters and buffers (real, or on the meta device) by fake
    tensors of the same shapes and dtypes on ``device``, in place; tied tensors stay tied."""
    made: dict[int, Tensor] = {}
    with mode:
        for owner in module.modules():
            for kind in ("_parameters", "_buffers"):
                for name, tensor in list(getattr(owner, kind).items()):
                    if tensor is None:
                        continue
                    if id(tensor) not in made:
                        fake = mode.from_tensor(tensor).to(device).detach()
                        if isinstance(tensor, nn.Parameter):
                            fake = nn.Parameter(fake, requires_grad=tensor.requires_grad)
                        made[id(tensor)] = fake
                    getattr(owner, kind)[name] = made[id(tensor)]


@contextlib.contextmanager
def gathered_weights(
    modules: list[nn.Module], dtype: torch.dtype | None
) -> Iterator[Callable[[], None]]:
    """FSDP2's gathered weights while the step runs: a copy of every floating parameter of
    ``modules`` in ``dtype`` (its ``MixedPrecisionPolicy``'s ``param_dtype``, or the
    parameters' own: FSDP2 all-gathers into a buffer of its own on any number of ranks;
    ``None``: not sharded, the parameters as they are).

    Under ``bf16-mixed`` FSDP2 gathers the student, its heads and the EMA student in bfloat16
    (:func:`~radio_lit.students.sharding.shard_for_training`): their forward runs on bfloat16
    weights (autocast casts nothing of theirs, DAMP draws its noise ``xi`` in bfloat16,
    σReparam's effective weights are cast once) and their unsharded gradients are produced in
    bfloat16 before the reduce-scatter. The cast weights are made inside the counter, so the
    gathered copy counts in the step peak, alive from the forward through the backward
    (``model.fsdp2.layout: student``, the shipped configs' [choice]: under ``blocks`` with
    ``reshard_after_forward`` a block's copy lives only while it runs, which over-counts).

    Yields ``reshard``: the parameters restored, the gathered copy dropped and the gradients
    kept, as FSDP2's post-backward reshard frees the unsharded weights before its
    reduce-scatter's buffers are made (torch's ``FSDPParamGroup.post_backward``). Restored
    afterwards in any case, gradients cleared."""
    saved: list[tuple[nn.Parameter, Tensor]] = []
    if dtype is not None:
        for module in modules:
            for parameter in module.parameters():
                if parameter.is_floating_point():  # FSDP2's all-gather output: a copy
                    saved.append((parameter, parameter.data))
                    parameter.data = parameter.data.to(dtype, copy=True)

    def reshard() -> None:
        for parameter, data in saved:
            parameter.data = data

    try:
        yield reshard
    finally:
        reshard()
        for parameter, _ in saved:
            parameter.grad = None


def largest_draws(partitions: Any) -> dict[str, int]:
    """``{partition: index}`` of each partition's largest resolution (by pixels) in a
    :class:`~radio_lit.training.partitions.PartitionPlan`."""
    return {
        name: max(range(len(sizes)), key=lambda i, s=sizes: s[i][0] * s[i][1])
        for name, sizes in partitions.resolutions.items()
    }


def fsdp2_copies(scattered: int, shard: int, world_size: int) -> int:
    """Bytes FSDP2's own copies move in a step beside the collectives, each read and written
    (torch's ``_fully_shard``): the all-gather's copy-in of the local shard
    (``foreach_all_gather``; on one rank the copy of the shard into the unsharded
    parameters, ``FSDPParamGroup.unshard``) and, on several, its copy-out into each
    parameter (``foreach_all_gather_copy_out``); the reduce-scatter's copy-in of the unsharded
    gradients (``foreach_reduce``) and, on several, the division of the reduced shard by the
    ranks, on one rank the copy that stands for the collective. Its buffers are allocated
    afresh each step: priced as the other operations' bytes (on a CPU, first-touch writes at
    a fraction of a large copy's bandwidth). ``scattered``, ``shard``: the reduce-scatter's
    input and output bytes (0: not sharded) [choice: the shard and the gathered weights in
    their float32 size for the all-gather's copies]."""
    if not scattered:
        return 0
    gather = 2 * shard + (2 * scattered if world_size > 1 else 0)  # copy-in, copy-out
    reduce = 2 * scattered + (2 * shard if world_size > 1 else 2 * scattered)
    return gather + reduce


@dataclass
class StepCount:
    """What one rank's step ran (:func:`count_step`).

    Attributes:
        images: ``{partition: images}`` this rank's chunks took.
        resolutions: ``{partition: (H, W)}`` the student's view of each chunk.
        flops: ``{part: FLOPs}`` (parts: ``teacher <name>``, ``upsampler <name>``,
            ``student forward``, ``head <name>``, ``EMA student``, ``backward``, ``other``).
        peak_bytes: the step's largest live bytes beyond the weights (module docstring).
        outputs: ``{teacher: [B, H, W, C]}`` each teacher's feature map as it returned it.
        ops: each part's operations by shape (:class:`OpRecord`).
        packed_kernel: the packed student forward's attention kernel (:func:`packed_attention`;
            ``None``: no packing, or one chunk).
    """

    images: dict[str, int]
    resolutions: dict[str, tuple[int, int]]
    flops: dict[str, int]
    peak_bytes: int
    outputs: dict[str, list[int]] = field(default_factory=dict)
    ops: OpRecord = field(default_factory=OpRecord)
    packed_kernel: str | None = None

    @property
    def total_flops(self) -> int:
        return sum(self.flops.values())

    @property
    def total_images(self) -> int:
        return sum(self.images.values())


def _parts(module: Any) -> Iterator[tuple[str, nn.Module]]:
    """``(label, submodule)`` of the step's named parts."""
    for name, teacher in module.teachers.items():
        yield f"teacher {name}", teacher
        upsampler = getattr(teacher, "upsampler", None)
        if isinstance(upsampler, nn.Module):
            yield f"upsampler {name}", upsampler
    yield "student forward", module.student
    for name, head in module.heads.items():  # matching calls a head's parts, not the head
        for part in head.children():
            yield f"head {name}", part
    if getattr(module, "ema", None) is not None:  # MESA runs the EMA's parts, not the EMA
        for part in module.ema.children():
            yield "EMA student", part


@contextlib.contextmanager
def _labelled(module: Any, counter: StepCounter, outputs: dict[str, list[int]]) -> Iterator[None]:
    """Forward hooks that enter each named part while it runs, and note teachers' outputs."""
    handles, open_parts = [], []

    def enter(label: str) -> Any:
        def hook(*_: Any) -> None:
            part = counter.part(label)
            part.__enter__()
            open_parts.append(part)

        return hook

    def leave(label: str) -> Any:
        def hook(_: Any, __: Any, out: Any) -> None:
            open_parts.pop().__exit__(None, None, None)
            features = getattr(out, "features", None)
            if label.startswith("teacher ") and isinstance(features, Tensor):
                outputs[label.removeprefix("teacher ")] = list(features.shape)

        return hook

    for label, part in _parts(module):
        handles.append(part.register_forward_pre_hook(enter(label)))
        handles.append(part.register_forward_hook(leave(label)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def count_step(
    module: Any,
    mode: Any,
    crop_size: int,
    batch: int,
    autocast: torch.dtype | None,
    world_size: int = 1,
    rank: int = 0,
    device: str = "cpu",
    gpu_attention: bool = True,
    gathered: torch.dtype | None = None,
    previous_gradients: int = 0,
    draws: Mapping[str, int] | None = None,
    trunk_frozen: bool = False,
    estimating: bool = False,
    reduce_scatter: tuple[int, int] = (0, 0),
    blocks: Any = None,
) -> StepCount:
    """One training step of global rank ``rank`` of ``world_size`` on fake tensors.

    Args:
        module: a :class:`~radio_lit.module.DistillationModule` whose tensors are fake
            (:func:`fake_module`) under ``mode`` (a ``FakeTensorMode``).
        crop_size: the data's crop side ``S``; the rank's batch is ``[batch, 3, S, S]`` uint8.
        autocast: the mixed-precision dtype (``bf16-mixed``: ``torch.bfloat16``), or ``None``.
        world_size, rank: where the partitions are placed (:meth:`PartitionPlan.place`).
        device: the fake tensors' device (``"cpu"``: torch's autograd engine needs a real
            device context for CUDA tensors, fake ones included).
        gpu_attention: attention as a GPU runs it (:func:`fused_attention`); ``False``: as
            ``device`` does (a check against a real step there).
        gathered: FSDP2's gathered dtype of the student, heads and EMA student
            (:func:`gathered_weights`; ``None``: not sharded).
        reduce_scatter: FSDP2's buffers once the backward has produced the unsharded
            gradients: ``(input bytes, output bytes)`` of its reduce-scatter (the unsharded
            gradients copied in, in the reduce dtype; this rank's float32 shard out), alive
            together beside those gradients [choice: one reduce-scatter of the whole student,
            ``model.fsdp2.layout: student``, the shipped configs'; a unit per block
            reduce-scatters a block's at a time, which this over-counts]; their copies' bytes
            are moved in the step's ``other`` part (:func:`fsdp2_copies`).
        blocks: a :class:`~radio_lit.planning.repeated_blocks.BlockRecords` to count each
            distinct block call once in and replay from (kept across a plan's counts;
            ``None``: every block counted in full).
        previous_gradients: bytes of the previous step's gradients on this rank (float32,
            FSDP2's shard of them), alive through the forward: Lightning's loop calls
            ``zero_grad`` (``set_to_none``) after ``training_step`` and before ``backward``, so
            every step after the first runs its forward beside them. Counted from the start
            of the step until the backward begins.
        draws: ``{partition: index}`` of the resolution each partition with several takes
            this step; the others, and by default all, at their largest [choice: the step that
            sets the peak memory and the longest one; a run draws one per step, and
            the plan averages the step time over the counts of each draw].
        trunk_frozen: a step whose trunk :class:`~radio_lit.callbacks.FreezeBody` holds
            (``StudentStep.trunk_frozen``: the EMA student's trunk and MESA's backbone-only
            forward do not run).
        estimating: a step of ``TeacherStatsEstimation`` (the teacher statistics accumulated;
            their refit, every ``refit_every`` steps, not counted).

    Statistics are taken as fitted (the steady state after ``TeacherStatsEstimation``'s steps,
    and its estimation steps after their first refit), and a published model's imported heads
    composed with them (``module.imported_heads`` is emptied).
    """
    from radio_lit.students.spectral_reparam import spectral_step

    plan = module.partitions
    plan.place(world_size, rank)
    picks = {**largest_draws(plan), **(draws or {})}
    for statistics in module.teacher_statistics().values():
        for normalizer in statistics.values():
            normalizer._is_fitted = True  # the host flag every statistic reads
    module.estimate_statistics, module.refit_statistics = estimating, False
    imported = getattr(module, "imported_heads", None)  # model.init_from's published heads:
    if imported is not None:  # taken as composed with those statistics (a refit's, not a step's)
        imported.names.clear()
    for parameter in module.parameters():  # an earlier count's gradients: not this step's
        parameter.grad = None
    module.train()
    for teacher in module.teachers.values():
        teacher.eval()
    module.student_step.trunk_frozen = trunk_frozen
    counter, outputs = StepCounter(), {}
    precision = (
        torch.autocast(device, dtype=autocast) if autocast is not None else contextlib.nullcontext()
    )
    seen: dict[str, Any] = {}
    chunks_of = module.partitions.chunks

    def chunks(crop: Tensor, train: bool) -> list[Any]:
        made = chunks_of(crop, train)
        seen.update({c.partition: c for c in made})
        return made

    with mode:  # the step's tensors follow from the fake batch and weights; the host's stay real
        pixels = torch.empty(batch, 3, crop_size, crop_size, dtype=torch.uint8, device=device)
        previous = torch.empty(previous_gradients, dtype=torch.uint8, device=device)
    with (
        mock.patch.object(plan, "_draw", lambda name: picks[name]),
        mock.patch.object(plan, "chunks", chunks),
        _labelled(module, counter, outputs),
        fused_attention(device) if gpu_attention else _no_fast_path(),
        _cuda_known(),
        packed_attention(module, gpu_attention) as kernel,
        counter,
        contextlib.ExitStack() as stack,
    ):
        counter.track(pixels)
        if previous_gradients:
            counter.track(previous)
        sharded = [module.student, module.heads, *filter(None, [getattr(module, "ema", None)])]
        reshard = stack.enter_context(gathered_weights(sharded, gathered))
        if blocks is not None:
            stack.enter_context(blocks.replaying(module, counter))
        module.student.begin_step(0, 0)  # the student's per-step draws (ViTDet), seed 0
        with precision, spectral_step(module.student):
            loss = module._shared_step(pixels, "train")
        del previous  # zero_grad(set_to_none=True): the previous step's gradients freed
        with counter.part(BACKWARD):
            loss.backward()
            reshard()  # the gathered weights freed before the reduce-scatter's buffers
            with mode:
                buffers = [torch.empty(n, dtype=torch.uint8, device=device) for n in reduce_scatter]
            for buffer in buffers:
                if buffer.numel():
                    counter.track(buffer)
            del buffers
        counter.ops.moved[OTHER] += fsdp2_copies(*reduce_scatter, world_size)
        peak = counter.peak
    module.student_step.trunk_frozen = module.estimate_statistics = False
    return StepCount(
        images={name: int(c.crop.shape[0]) for name, c in seen.items()},
        resolutions={name: tuple(c.resolution) for name, c in seen.items()},
        flops=dict(counter.flops),
        peak_bytes=peak,
        outputs=outputs,
        ops=counter.ops,
        packed_kernel=kernel if len(seen) > 1 else None,
    )
