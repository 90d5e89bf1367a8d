"""What a piece of training code dispatches: aten operations counted by ``torch.profiler``.

On a GPU each operation that Python dispatches costs a few microseconds of host time (most
launch a kernel), so a step that dispatches thousands of small operations is bound by the host,
not by the device. Operation counts do not depend on the machine's load, which makes them the
CPU-measurable proxy of that cost.

"Top-level" operations are those not nested in another aten operation: what Python (or
autograd's engine, for a backward) dispatches. "All" counts nested ones too.

Scalar reads (:class:`ScalarReads`; a boolean-mask index or ``nonzero``, whose output size is
read back, counts as one) are told apart by whether they would wait for a GPU.
"""

from __future__ import annotations

import traceback
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, profile
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakTensorKeyDictionary


@dataclass(frozen=True)
class OperationCount:
    """Aten operations of one measured call: ``top_level`` (dispatched) and ``total``."""

    top_level: int
    total: int
    by_name: Counter[str]

    def __str__(self) -> str:
        return f"{self.top_level} top-level ({self.total} in all)"


def _is_aten(event: Any) -> bool:
    return event.name.startswith("aten::")


def count_events(events: Iterable[Any]) -> OperationCount:
    """Top-level and total aten operations among a profiler's ``events()``."""
    top, total, names = 0, 0, Counter()
    for event in events:
        if not _is_aten(event):
            continue
        total += 1
        parent = event.cpu_parent
        while parent is not None and not _is_aten(parent):
            parent = parent.cpu_parent
        if parent is None:
            top += 1
            names[event.name] += 1
    return OperationCount(top, total, names)


def count_operations(fn: Callable[[], Any]) -> tuple[Any, OperationCount]:
    """Run ``fn()`` once under ``torch.profiler`` (CPU activity): its result and its count."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result = fn()
    return result, count_events(prof.events())


def forward_backward_counts(
    model: torch.nn.Module, inputs: torch.Tensor, loss: Callable[[Any], torch.Tensor]
) -> tuple[OperationCount, OperationCount]:
    """Operations of one training forward (``loss(model(inputs))`` excluded from neither side's
    backward) and of its backward, each counted on its own."""
    model.train()
    out, forward = count_operations(lambda: model(inputs))
    value = loss(out)
    _, backward = count_operations(value.backward)
    return forward, backward


@dataclass(frozen=True)
class ScalarRead:
    """One scalar read (``.item()``, ``float(t)``, ``bool(t)``...) or copy to the host: whether
    its tensor is on the device (on a GPU: a host-device synchronisation) and the innermost
    frame outside torch that made it, ``file:line``."""

    on_device: bool
    where: str


class ScalarReads(TorchDispatchMode):
    """Every scalar read (aten ``_local_scalar_dense``) and every copy of a device tensor to the
    host (``.cpu()``, ``.tolist()``...) made while active, as a :class:`ScalarRead`, told apart
    by whether its tensor is on the device.

    On a GPU a read of a device tensor waits for every queued kernel (a host-device
    synchronisation); a read of a host tensor does not. A CPU run has no device tensors, so
    there the device is followed by provenance (:class:`DeviceTensors`): a tensor is on the
    device when it comes from the module's parameters and buffers (``track``), from the batch,
    from a call that names a device (``device=``, ``.to(device)``), or from any operation on such
    a tensor; ``.cpu()``, the device spelled ``"cpu"`` (torch.optim's step counts) and tensors
    made without a device are the host's (the data loader's random numbers, a library's
    host-side checks).
    """

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[ScalarRead] = []
        self.provenance = DeviceTensors(self.reads)

    def track(self, *tensors: torch.Tensor) -> None:
        """Count ``tensors`` (and what is computed from them) as on the device."""
        for tensor in tensors:
            self.provenance.device[tensor] = True

    def __enter__(self) -> ScalarReads:
        self.provenance.__enter__()
        return super().__enter__()

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        self.provenance.__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        if func is torch.ops.aten._local_scalar_dense.default:
            self.reads.append(ScalarRead(self._on_device(args[0]), _asking_frame()))
        elif _data_shaped(func, args):  # its output's size is read back from the device
            on_device = any(self._on_device(t) for t in _tensors(args))
            self.reads.append(ScalarRead(on_device, _asking_frame()))
        return func(*args, **(kwargs or {}))

    def _on_device(self, tensor: torch.Tensor) -> bool:
        return tensor.device.type != "cpu" or tensor in self.provenance.device

    @property
    def device_syncs(self) -> list[ScalarRead]:
        """The reads of device tensors: host-device synchronisations on a GPU."""
        return [read for read in self.reads if read.on_device]


class DeviceTensors(TorchFunctionMode):
    """Follows which tensors would be on the device (see :class:`ScalarReads`) through every
    torch call made from Python while active (``Tensor.grad`` included)."""

    def __init__(self, copies: list[ScalarRead]) -> None:
        super().__init__()
        self.device: WeakTensorKeyDictionary = WeakTensorKeyDictionary()
        self.copies = copies  # where device tensors are copied to the host

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        target = _target(args, kwargs) if func is torch.Tensor.to else kwargs.get("device")
        if func in _TO_HOST or target == "cpu":
            if any(t in self.device for t in _tensors(args[:1])):  # a copy to the host
                self.copies.append(ScalarRead(True, _asking_frame()))
            # on a CPU run the tensor itself comes back; on a GPU it would be a host copy
            return out.clone() if any(out is t for t in _tensors(args)) else out
        named = target is not None
        inputs = _tensors((args, kwargs))
        if named or any(t in self.device for t in inputs):
            given = {id(t) for t in inputs}  # passed through (grouped, in place): unchanged
            for tensor in _tensors(out):
                if id(tensor) not in given:
                    self.device[tensor] = True
        return out


_TO_HOST = (torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.tolist)

#: Operations whose output size depends on their input's values: on a GPU the host reads that
#: size back before it can go on (a boolean-mask index ``x[mask]`` is ``aten.index`` with a
#: bool index).
_DATA_SHAPED = {
    torch.ops.aten.nonzero.default,
    torch.ops.aten.masked_select.default,
    torch.ops.aten._unique2.default,
    torch.ops.aten.unique_dim.default,
    torch.ops.aten.unique_consecutive.default,
}


def _data_shaped(func: Any, args: tuple[Any, ...]) -> bool:
    """Whether ``func(*args)`` is one of :data:`_DATA_SHAPED` or a boolean-mask index."""
    if func in _DATA_SHAPED:
        return True
    if func is torch.ops.aten.index.Tensor:
        return any(t.dtype in (torch.bool, torch.uint8) for t in _tensors(args[1]))
    return False


def _target(args: tuple[Any, ...], kwargs: dict[str, Any]) -> object:
    """The device ``Tensor.to`` is given (a ``torch.device`` or a string), else ``None``."""
    given = [kwargs.get("device"), *args[1:2]]
    return next((d for d in given if isinstance(d, torch.device | str)), None)


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [leaf for leaf in tree_leaves(tree) if isinstance(leaf, torch.Tensor)]


def _asking_frame() -> str:
    """``file:line`` of the innermost frame outside torch itself (torch.optim counts as
    asking: its step counts)."""
    frames = [(f.filename.replace("\\", "/"), f.lineno) for f in traceback.extract_stack()]
    ours = [
        (path, line)
        for path, line in frames
        if ("/site-packages/torch/" not in path or "/torch/optim/" in path) and path != __file__
    ]
    path, line = (ours or frames)[-1]
    short = path.rsplit("/site-packages/", 1)[-1]
    if "/radio_lit/" in short:
        short = "radio_lit/" + short.rsplit("/radio_lit/", 1)[1]
    return f"{short}:{line}"
