"""``model.compile``: ``torch.compile`` of the student and of each teacher; a teacher's own
``speed.compile`` (:mod:`radio_lit.teachers.speed`) compiles its encoder alone.

Each model is compiled in place (``nn.Module.compile``), so parameter names, state dicts and
checkpoints stay those of the eager model. Under FSDP2 it runs after ``fully_shard`` (the order
torch's FSDP2 documents). The student compiles without graph breaks, σReparam included
(:func:`radio_lit.students.spectral_reparam.spectral_step` computes its weights inside the
compiled forward); a teacher whose library code breaks the graph still runs, in several graphs.
A teacher's ``compile`` compiles its encoder call with static shapes (:class:`CompiledCall`):
a frozen teacher sees one input shape per partition and resolution, each compiled once.

Every model compiled in place shares one code object (``nn.Module``'s call), and so do the
encoders of teachers of one class; dynamo keeps its compiled versions, and counts its
recompilations against ``recompile_limit``, per code object: the student and the teachers
would share one budget (8 by default; a student and three teachers at two shapes each use it
up, and what comes next runs eagerly, with a warning), so the limit is raised to the default
budget per compiled model (:func:`allow_recompiles`). [choice]
"""

from __future__ import annotations

import time
import warnings
import weakref
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch._dynamo.utils import counters

CompileOption = bool | dict[str, Any]
"""``False`` (eager), ``True`` (``torch.compile``'s defaults: inductor) or the keyword arguments
of ``torch.compile`` (``{"mode": "reduce-overhead"}``, ``{"backend": "aot_eager"}``...)."""


#: Recompilations each compiled model may use: dynamo's default ``recompile_limit``.
PER_MODEL_RECOMPILES: int = torch._dynamo.config.recompile_limit

#: The models (or callables) given a budget by :func:`allow_recompiles`, while they live.
_BUDGETED: weakref.WeakSet[Any] = weakref.WeakSet()


def allow_recompiles(owner: Any) -> None:
    """Give ``owner`` (a compiled model) :data:`PER_MODEL_RECOMPILES` of dynamo's
    ``recompile_limit``, on top of every other live compiled model's (the module docstring says
    why). Never lowers the limit."""
    _BUDGETED.add(owner)
    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, PER_MODEL_RECOMPILES * len(_BUDGETED))


def compile_models(models: Iterable[nn.Module], option: CompileOption) -> None:
    """``nn.Module.compile`` every model of ``models`` with ``option``'s arguments, in place,
    with :data:`PER_MODEL_RECOMPILES` each (the module docstring says why). A teacher's
    ``compile`` compiles its encoder with static shapes, unless its own ``speed.compile``
    says otherwise (:meth:`radio_lit.teachers.Teacher.compile`)."""
    if option is False:
        return
    kwargs = {} if option is True else dict(option)
    for model in models:
        allow_recompiles(model)
        model.compile(**kwargs)


def uses_cuda_graphs(kwargs: dict[str, Any]) -> bool:
    """Whether ``torch.compile(**kwargs)`` records CUDA graphs (inductor's ``reduce-overhead``
    and ``max-autotune`` modes, or ``options={"triton.cudagraphs": True}``)."""
    options = kwargs.get("options") or {}
    if "triton.cudagraphs" in options:
        return bool(options["triton.cudagraphs"])
    return kwargs.get("mode") in ("reduce-overhead", "max-autotune")


@dataclass
class CompileStats:
    """What compiling one callable cost, counted by dynamo (``counters``) around its calls.

    Attributes:
        graphs: graphs dynamo compiled during its calls (``stats.unique_graphs``).
        frames: frames dynamo compiled (one per graph, more where code breaks the graph).
        seconds: wall-clock seconds of the calls that compiled (the compilation, autotuning
            and that one run; host time).
        shapes: the distinct input signatures (shape, dtype, device) it was called with.
        recompiles: compilations during calls with a signature already seen: recompiles in
            steady state (0 when every shape was compiled once, at its first call).
        reported: ``graphs`` when it was last reported (:class:`radio_lit.teachers.speed.
            SpeedReport`).
    """

    graphs: int = 0
    frames: int = 0
    seconds: float = 0.0
    shapes: list[Hashable] = field(default_factory=list)
    recompiles: int = 0
    reported: int = 0


class CompiledCall:
    """``torch.compile(fn, **option)`` with static shapes, and :class:`CompileStats`.

    ``dynamic=False`` unless the option gives ``dynamic``: each input shape gets its own
    graph, compiled at its first call, and no shape makes dynamo recompile for dynamic shapes.
    The compiled function is built at the first call (a module holding this can be pickled or
    copied until then) with its own :func:`allow_recompiles` budget.

    Args:
        fn: the callable, ``fn(x: Tensor) -> Any``.
        option: ``True`` or ``torch.compile``'s keyword arguments.
        name: what a steady-state recompile warning names.
    """

    def __init__(self, fn: Callable[[torch.Tensor], Any], option: CompileOption, name: str):
        self.kwargs: dict[str, Any] = {} if option is True else dict(option)
        self.kwargs.setdefault("dynamic", False)
        self.fn = fn
        self.name = name
        self.stats = CompileStats()
        self.cuda_graphs = uses_cuda_graphs(self.kwargs)
        self._compiled: Callable[[torch.Tensor], Any] | None = None

    def __call__(self, x: torch.Tensor) -> Any:
        if self._compiled is None:
            allow_recompiles(self)
            self._compiled = torch.compile(self.fn, **self.kwargs)
        signature = (tuple(x.shape), x.dtype, str(x.device))
        graphs, frames = counters["stats"]["unique_graphs"], counters["frames"]["total"]
        start = time.perf_counter()
        out = self._compiled(x)
        new_frames = counters["frames"]["total"] - frames
        if new_frames:
            stats = self.stats
            stats.graphs += counters["stats"]["unique_graphs"] - graphs
            stats.frames += new_frames
            stats.seconds += time.perf_counter() - start
            if signature in stats.shapes:
                stats.recompiles += new_frames
                warnings.warn(
                    f"{self.name} was compiled again for an input it had run compiled "
                    f"({list(signature[0])}); set TORCH_LOGS=recompiles to see why",
                    stacklevel=2,
                )
        if signature not in self.stats.shapes:
            self.stats.shapes.append(signature)
        return out
