"""What a module dispatches on a GPU, counted on a machine without one.

A forward runs on *fake* CUDA tensors (``torch._subclasses.FakeTensorMode``: shapes, dtypes and
devices, no data, no computation), so every operator goes through the CUDA dispatch keys,
CUDA autocast included, at full size and in seconds. :class:`Dispatched` counts what reaches the
kernels (below autograd and autocast): operations by name, casts (``aten::_to_copy``), layout
copies (``aten::clone``, ``aten::copy_``) and the bytes those read and write. Two things a real
GPU decides are set as an NVIDIA H100 decides them:

- ``torch.autocast("cuda", bf16)`` as Lightning's ``bf16-mixed`` enables it (set through
  ``torch.set_autocast_enabled``, which does not ask for a device);
- SDPA's backend (:func:`hopper_attention`): flash attention for bf16/fp16 without a mask
  (head dim <= 256), else memory-efficient attention with the mask padded to 16 elements as
  PyTorch's composite pads it (without a GPU the selection falls back to the math path, which
  upcasts bf16 to float32).

Counts are at the dispatcher's level (a composite operation such as ``linear`` shows as its
parts, views included), so they compare like with like between two runs of this module, not
with ``torch.profiler``'s counts of a real step.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from radio_lit.planning.counting import gpu_attention

CASTS = ("aten._to_copy",)
COPIES = ("aten.clone", "aten.copy_")


def _bytes(tensor: Any) -> int:
    return tensor.numel() * tensor.element_size() if isinstance(tensor, torch.Tensor) else 0


class Dispatched(TorchDispatchMode):
    """Operations dispatched while active: ``ops`` (by ``aten.<name>``, ``prim`` queries left
    out), ``casts`` and ``copies`` (calls) and ``moved`` (bytes read and written by both), and
    the dtypes that layer norms returned (``norm_dtypes``: float32 under an autocast island)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.moved = 0
        self.norm_dtypes: Counter[torch.dtype] = Counter()

    @property
    def casts(self) -> int:
        return sum(self.ops[name] for name in CASTS)

    @property
    def copies(self) -> int:
        return sum(self.ops[name] for name in COPIES)

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        name = str(func.overloadpacket)
        out = func(*args, **kwargs)
        if name.startswith("aten."):
            self.ops[name] += 1
            if name in CASTS or name in COPIES:
                source = args[1] if name == "aten.copy_" else args[0]
                self.moved += _bytes(source) + _bytes(out)
            if name == "aten.native_layer_norm":
                self.norm_dtypes[out[0].dtype] += 1
        return out


@contextlib.contextmanager
def hopper_attention() -> Iterator[None]:
    """``F.scaled_dot_product_attention`` as PyTorch's CUDA composite runs it on an H100
    (flash attention without a mask, memory-efficient attention with one, after autocast's
    casts and the mask's alignment padding) while the block runs, on any device: without a GPU
    its backend selection falls back to the math path, which upcasts bf16 to float32. (Patched
    on ``torch.nn.functional``, where libraries look it up at each call.)"""
    from unittest import mock

    with mock.patch.object(F, "scaled_dot_product_attention", gpu_attention("cuda")):
        yield


@contextlib.contextmanager
def cuda_autocast(enabled: bool, dtype: torch.dtype = torch.bfloat16) -> Iterator[None]:
    """CUDA autocast on (as ``bf16-mixed``) or off while the block runs, with no GPU needed."""
    was, was_dtype = torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")
    torch.set_autocast_enabled("cuda", enabled)
    torch.set_autocast_dtype("cuda", dtype)
    try:
        yield
    finally:
        torch.set_autocast_enabled("cuda", was)
        torch.set_autocast_dtype("cuda", was_dtype)


class FakeCuda:
    """Fake CUDA tensors and module states for a few runs (a ``FakeTensorMode``); use as a
    context manager: tensors that radio-lit caches per device (pixel statistics) are made
    under the fake mode by the first run and forgotten when the block ends."""

    def __init__(self) -> None:
        from torch._subclasses.fake_tensor import FakeTensorMode

        self.mode = FakeTensorMode(allow_non_fake_inputs=True)

    def __enter__(self) -> FakeCuda:
        return self

    def __exit__(self, *exc: object) -> None:
        from radio_lit.data import views

        for cached in vars(views).values():  # functools.lru_cache'd per-device constants
            if callable(getattr(cached, "cache_clear", None)):
                cached.cache_clear()

    def state(self, module: nn.Module) -> dict[str, torch.Tensor]:
        """``module``'s parameters and buffers as fake CUDA tensors (real, meta or CPU ones)."""
        named = {**dict(module.named_parameters()), **dict(module.named_buffers())}
        with self.mode:
            return {name: self.mode.from_tensor(t).to("cuda") for name, t in named.items()}

    def empty(self, *shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        with self.mode:
            return torch.empty(*shape, dtype=dtype, device="cuda")

    def run(
        self,
        module: nn.Module,
        state: dict[str, torch.Tensor],
        args: tuple[Any, ...],
        autocast: bool,
        fn: Any = None,
        warm: bool = False,
    ) -> tuple[Any, Dispatched]:
        """``module(*args)`` (or ``fn(*args)``) with ``state`` swapped in, on fake CUDA tensors,
        under CUDA bf16 autocast or not: its outputs and what it dispatched. ``warm``: count a
        second call (the first fills per-device caches, as a training run's first step does;
        needed once per :class:`FakeCuda`)."""
        from torch.nn.utils.stateless import _reparametrize_module

        counter = Dispatched()
        swapped = _reparametrize_module(module, state)
        with self.mode, swapped, cuda_autocast(autocast), hopper_attention():
            if warm:
                (fn or module)(*args)
            with counter:
                out = (fn or module)(*args)
        return out, counter


def outputs_of(out: Any) -> list[torch.Tensor]:
    """The tensors in ``out`` (a dataclass such as ``TeacherOutput``, a tuple...)."""
    if hasattr(out, "__dataclass_fields__"):
        out = [getattr(out, f) for f in out.__dataclass_fields__]
    return [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
