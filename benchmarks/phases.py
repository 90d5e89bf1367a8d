"""A training step cut into named phases: where each millisecond, operation and FLOP goes.

``benchmarks/profile_step.py`` and ``benchmarks/train_step.py`` measure radio-lit's step with
these parts:

* :class:`PhaseClock`: exclusive time (device-synchronised), ``record_function`` labels or
  FLOP deltas of nested named phases;
* :func:`instrument`: the step's phases labelled on the built module (views, each teacher,
  student forward, each head, grid matching, normalizers, losses, guard; C-RADIOv4's shifts,
  DAMP, EMA forward and update), :func:`uninstrument` undoing the patches of module names;
* :class:`Driver`: a Lightning callback that times chosen steps, profiles one, follows one
  step's scalar reads and FLOP-counts another;
* :func:`attribute`, :func:`copy_counts`: a profile's events per phase, and the copies, casts
  and bytes among them.
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

from benchmarks.dispatch import ScalarReads

#: The phase of what no named phase covers: Lightning's loop, logging, callbacks.
OTHER = "Lightning + logging"


# ------------------------------------------------------------------------------------------
# phases
# ------------------------------------------------------------------------------------------
class PhaseClock:
    """Exclusive time, operation and FLOP attribution to nested named phases.

    ``mode``: ``"time"`` (device-synchronised wall time at every boundary), ``"profile"``
    (``record_function`` labels only) or ``"flops"`` (deltas of a ``FlopCounterMode``'s total).
    """

    def __init__(self, sync: Callable[[], None]) -> None:
        self.sync = sync
        self.mode: str | None = None
        self.flop_counter: Any = None
        self.stack: list[list[Any]] = []  # [name, start, child_total]
        self.times: dict[str, float] = defaultdict(float)
        self.flops: dict[str, float] = defaultdict(float)

    def _now(self) -> float:
        if self.mode == "flops":
            return float(self.flop_counter.get_total_flops())
        self.sync()
        return time.perf_counter()

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        if self.mode is None:
            yield
            return
        if self.mode == "profile":
            import torch

            with torch.profiler.record_function(f"phase: {name}"):
                yield
            return
        self.stack.append([name, self._now(), 0.0])
        try:
            yield
        finally:
            _, start, children = self.stack.pop()
            spent = self._now() - start
            target = self.flops if self.mode == "flops" else self.times
            target[name] += spent - children
            if self.stack:
                self.stack[-1][2] += spent

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*a: Any, **k: Any) -> Any:
            with self.phase(name):
                return fn(*a, **k)

        return timed

    def hook_module(self, name: str, module: Any) -> None:
        """``name`` covers ``module``'s forward (pre and post forward hooks)."""
        contexts: list[Any] = []

        def pre(*_: Any) -> None:
            context = self.phase(name)
            context.__enter__()
            contexts.append(context)

        def post(*_: Any) -> None:
            contexts.pop().__exit__(None, None, None)

        module.register_forward_pre_hook(pre)
        module.register_forward_hook(post)


#: The module-level names :func:`instrument` wrapped, with their originals: ``(module, name,
#: original)``; :func:`uninstrument` puts them back (an in-process caller, e.g. a test).
_PATCHED: list[tuple[Any, str, Any]] = []


def _patch(code: Any, name: str, clock: PhaseClock, phase: str) -> None:
    """``code.<name>`` labelled as ``phase`` until :func:`uninstrument`."""
    original = getattr(code, name)
    _PATCHED.append((code, name, original))
    setattr(code, name, clock.wrap(phase, original))


def uninstrument() -> None:
    """Undo :func:`instrument`'s patches of module-level names (the built objects' patches
    go with them)."""
    while _PATCHED:
        code, name, original = _PATCHED.pop()
        setattr(code, name, original)


def instrument(cli: Any, clock: PhaseClock) -> None:
    """Label the step's phases (benchmark-only patches of the built objects and names;
    :func:`uninstrument` undoes those of names)."""
    import radio_lit.training.losses as losses_code
    import radio_lit.training.matching as matching_code
    import radio_lit.training.student_step as student_step_code
    import radio_lit.training.teachers as teachers_code

    module = cli.model
    _patch(teachers_code, "outer_view", clock, "views")
    _patch(student_step_code, "teacher_view", clock, "views")
    instrument_student_step(module, clock)
    _patch(teachers_code, "to_loss_grid", clock, "grid matching")
    _patch(matching_code, "match_teachers", clock, "grid matching")
    _patch(losses_code, "balanced_loss", clock, "losses")
    _patch(losses_code, "idle_heads_term", clock, "losses")
    module.normalized_targets = clock.wrap("normalizers", module.normalized_targets)
    module.distillation_losses = clock.wrap("losses", module.distillation_losses)
    for name, teacher in module.teachers.items():
        clock.hook_module(f"teacher {name}", teacher)
    clock.hook_module("student forward", module.student)
    for name, pair in module.heads.items():
        for head in (pair.features, pair.summary):
            if head is not None:
                clock.hook_module(f"head {name}", head)
    for callback in cli.trainer.callbacks:
        if type(callback).__name__ == "NonFiniteGuard":
            for hook in ("on_train_batch_start", "on_before_optimizer_step"):
                setattr(callback, hook, clock.wrap("guard", getattr(callback, hook)))


def instrument_student_step(module: Any, clock: PhaseClock) -> None:
    """C-RADIOv4's parts around the student (radio_lit.training.student_step): the view shifts
    (drawn
    on the host, views cut from the crop, maps moved back to the region's frame: "shifts",
    the resizes: "views"), DAMP's noise (inside "student forward"), the EMA student's forward
    (MESA's) and its update after each optimizer step, and the MESA term ("losses")."""
    import radio_lit.geometry.shifts as shifts_code
    import radio_lit.students.ema as ema_code
    import radio_lit.training.losses as losses_code
    import radio_lit.training.matching as matching_code
    import radio_lit.training.teachers as teachers_code
    import radio_lit.training.views as views_code

    _patch(shifts_code, "outer_view", clock, "views")
    for code in (shifts_code, teachers_code):
        _patch(code, "cut_view", clock, "shifts")
    for code in (teachers_code, matching_code, ema_code):
        _patch(code, "to_crop_frame", clock, "shifts")
    _patch(losses_code, "mesa_loss", clock, "losses")
    _patch(views_code, "shifted_chunks", clock, "shifts")
    step = module.student_step
    if step.damp is not None:
        step.damp.apply = clock.wrap("DAMP", step.damp.apply)
    if module.ema is not None:
        clock.hook_module("EMA forward", module.ema.student)
        for pair in module.ema.heads.values():
            for head in (pair.features, pair.summary):
                if head is not None:
                    clock.hook_module("EMA forward", head)
        module.ema.update = clock.wrap("EMA update", module.ema.update)


# ------------------------------------------------------------------------------------------
# the run
# ------------------------------------------------------------------------------------------
class Driver:
    """A Lightning callback that times, profiles and FLOP-counts chosen steps.

    ``extras``: what follows the timed and profiled steps, ``"reads"`` (scalar reads) and
    ``"flops"`` (the FLOP step); benchmarks/train_step.py asks for neither.
    """

    def __init__(
        self,
        args: argparse.Namespace,
        clock: PhaseClock,
        device: Any,
        extras: tuple[str, ...] = ("reads", "flops"),
    ) -> None:
        self.args, self.clock, self.device, self.extras = args, clock, device, extras
        self.step_times: list[float] = []
        self.phase_times: list[dict[str, float]] = []
        self.step_flops: dict[str, float] = {}
        self.profile: Any = None
        self.scalar_reads = ScalarReads()
        self.start = 0.0
        self.backward: Any = None  # the open "backward" phase
        self.batch_shape: tuple[int, ...] = ()

    def schedule(self, step: int) -> str | None:
        timed = self.args.warmup + self.args.steps
        if self.args.warmup <= step < timed:
            return "time"
        # scalar reads are counted on step timed + 1, until the next step starts (its logging
        # comes after its last callback), then a gap: dispatch modes nest, they do not overlap
        if step == timed + 3 and "flops" in self.extras:
            return "flops"
        return "profile" if step == timed else None

    def callback(self) -> Any:
        from lightning.pytorch.callbacks import Callback

        driver = self

        class _Callback(Callback):
            def on_train_start(self, trainer: Any, pl_module: Any) -> None:
                optimizer = trainer.optimizers[0]
                original = optimizer.step

                def step(closure: Callable[[], Any] | None = None, **kwargs: Any) -> Any:
                    loss = closure() if closure is not None else None  # forward and backward
                    with driver.clock.phase("optimizer"):
                        original(**kwargs)
                    return loss

                optimizer.step = step
                driver.begin(trainer.global_step)

            def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, i: int):
                if hasattr(batch, "shape"):
                    driver.batch_shape = tuple(batch.shape)
                driver.count_reads(trainer.global_step, pl_module, batch)

            def on_before_backward(self, trainer: Any, pl_module: Any, loss: Any) -> None:
                driver.backward = driver.clock.phase("backward")
                driver.backward.__enter__()

            def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
                driver.backward.__exit__(None, None, None)

            def on_train_batch_end(self, trainer: Any, pl_module: Any, *_: Any) -> None:
                driver.end()
                driver.begin(trainer.global_step)

        return _Callback()

    def count_reads(self, step: int, module: Any, batch: Any) -> None:
        """Count scalar reads from the start of the step after the profiled one (its batch on
        the device) to the start of the next: the step, its logging, the next batch's loading
        (a step of its own: following tensors slows every operation)."""
        import torch

        profiled = self.args.warmup + self.args.steps + 1
        if "reads" not in self.extras:
            return
        if step == profiled:
            self.scalar_reads.__enter__()
            batch = [batch] if isinstance(batch, torch.Tensor) else []
            self.scalar_reads.track(*module.parameters(), *module.buffers(), *batch)
        elif step == profiled + 1:
            self.scalar_reads.__exit__(None, None, None)

    def time_data(self, datamodule: Any) -> None:
        """Time ``next()`` on the training data loader as "data wait"."""
        clock, make = self.clock, datamodule.train_dataloader

        def train_dataloader() -> Any:
            loader = make()
            cls = type(loader)

            def __iter__(this: Any) -> Iterator[Any]:  # noqa: N807
                iterator = cls.__iter__(this)
                while True:
                    with clock.phase("data wait"):
                        try:
                            item = next(iterator)
                        except StopIteration:
                            return
                    yield item

            loader.__class__ = type(f"Timed{cls.__name__}", (cls,), {"__iter__": __iter__})
            return loader

        datamodule.train_dataloader = train_dataloader

    def begin(self, step: int) -> None:
        """Start measuring step ``step``: from the end of the one before (data wait included)."""
        mode = self.schedule(step)
        self.clock.mode = mode
        self.clock.times.clear()
        self.clock.flops.clear()
        if mode == "profile":
            self.profile = start_profile(self.device)
        elif mode == "flops":
            from torch.utils.flop_counter import FlopCounterMode

            mapping = cpu_sdpa_mapping()
            self.clock.flop_counter = FlopCounterMode(display=False, custom_mapping=mapping)
            self.clock.flop_counter.__enter__()
        self.clock.sync()
        self.start = time.perf_counter()

    def end(self) -> None:
        mode = self.clock.mode
        self.clock.sync()
        total = time.perf_counter() - self.start
        if mode == "time":
            self.step_times.append(total)
            self.phase_times.append(dict(self.clock.times))
        elif mode == "profile":
            self.profile.__exit__(None, None, None)
        elif mode == "flops":
            self.clock.flop_counter.__exit__(None, None, None)
            self.step_flops = dict(self.clock.flops)
            self.step_flops["total"] = float(self.clock.flop_counter.get_total_flops())
        self.clock.mode = None


def start_profile(device: Any) -> Any:
    """An entered ``torch.profiler.profile`` of CPU (and, on CUDA, device) activity that
    records input shapes and dtypes (the bytes of copies: :func:`copy_counts`)."""
    import torch

    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profile = torch.profiler.profile(activities=activities, record_shapes=True)
    profile.__enter__()
    return profile


def _cpu_sdpa_flops(query: Any, key: Any, value: Any, *_: Any, **__: Any) -> int:
    from torch.utils.flop_counter import sdpa_flop_count

    return sdpa_flop_count(query, key, value)


def _cpu_sdpa_backward_flops(grad: Any, query: Any, key: Any, value: Any, *_: Any, **__: Any):
    from torch.utils.flop_counter import sdpa_backward_flop_count

    return sdpa_backward_flop_count(grad, query, key, value)


def cpu_sdpa_mapping() -> dict[Any, Any]:
    """FlopCounterMode's formulas for SDPA's CPU kernel, which torch's registry lacks (it counts
    the CUDA kernels and the math path: without these, attention FLOPs vanish on a CPU)."""
    import torch

    aten = torch.ops.aten
    return {
        aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops,
        aten._scaled_dot_product_flash_attention_for_cpu_backward: _cpu_sdpa_backward_flops,
    }


def attribute(events: list[Any]) -> dict[str, dict[str, Any]]:
    """Per phase: its events (innermost ``phase:`` label; backward threads are "backward")."""
    by_phase: dict[str, list[Any]] = defaultdict(list)
    main_thread = next((e.thread for e in events if e.name.startswith("phase: ")), None)
    for event in events:
        if event.name.startswith("phase: "):
            continue
        parent, phase = event.cpu_parent, None
        while parent is not None:
            if parent.name.startswith("phase: "):
                phase = parent.name.removeprefix("phase: ")
                break
            parent = parent.cpu_parent
        if phase is None:
            phase = "backward" if event.thread != main_thread else OTHER
        by_phase[phase].append(event)
    return by_phase


#: Bytes per element of the dtype names the profiler records (``input_dtypes``).
ELEMENT_BYTES = {
    "double": 8,
    "float": 4,
    "c10::BFloat16": 2,
    "c10::Half": 2,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
}


def copy_counts(events: list[Any]) -> tuple[int, int, int]:
    """``(copies, casts, bytes)`` among a profiler's events (recorded with shapes):
    ``aten::copy_`` calls (nested ones included: a cast, ``contiguous`` or ``clone`` copies
    through one), ``aten::_to_copy`` calls (dtype or device casts) and the bytes the copies
    read and write (source and destination, each ``numel x element size``; 4 bytes where the
    profiler records no dtypes: torch 2.11's ``FunctionEvent`` has no ``input_dtypes``)."""
    copies = casts = moved = 0
    for event in events:
        if event.name == "aten::_to_copy":
            casts += 1
        elif event.name == "aten::copy_":
            copies += 1
            shapes = event.input_shapes or []
            dtypes = getattr(event, "input_dtypes", None) or [None] * len(shapes)
            for shape, dtype in list(zip(shapes, dtypes, strict=False))[:2]:
                numel = 1
                for side in shape:
                    numel *= side
                moved += numel * ELEMENT_BYTES.get(dtype, 4)
    return copies, casts, moved
