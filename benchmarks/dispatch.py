"""What a piece of training code dispatches: aten operations counted by ``torch.profiler``.

On a GPU each operation that Python dispatches costs a few microseconds of host time (most
launch a kernel), so a step that dispatches thousands of small operations is bound by the host,
not by the device. Operation counts do not depend on the machine's load, which makes them the
CPU-measurable proxy of that cost.

"Top-level" operations are those not nested in another aten operation: what Python (or
autograd's engine, for a backward) dispatches. "All" counts nested ones too.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile


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
