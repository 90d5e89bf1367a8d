"""Where every millisecond of a training step goes: one command, any config, CPU or GPU.

Builds the config (and ``--model... --trainer... --data...`` overrides) with radio-lit's own
``RadioLitCLI``, at its real sizes with random weights (pretrained tags and checkpoints are
dropped; ``--teacher-depth K`` keeps every teacher's width and shortens it to K blocks, stated
in the output), trains it with the config's own Trainer and callbacks for ``--warmup`` steps,
then ``--steps`` timed steps, one profiled step, one step whose scalar reads are followed and
one FLOP-counted step, and prints per phase
(views, each teacher, student forward, each head, grid matching, normalizers, losses, backward,
optimizer, guard, data wait, and "Lightning + logging" for the rest of the step):

* time: median over the timed steps, every phase boundary device-synchronised (on CUDA);
* aten operations dispatched (top-level: not nested in another aten operation) and, on CUDA,
  kernel launches, from the profiled step (no synchronisation added there);
* FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` on the real modules during
  the FLOP step (forward and backward), achieved TFLOP/s and the share of the device's peak
  (a table of known GPUs' dense bf16 peaks; on a CPU, a measured float32 matmul peak);

and for the step: peak memory, its scalar reads (``.item()`` and the like) split into those
that synchronise with a GPU, with where each is made, and those of host state (the data
loader's, the optimizer's step counts: ``benchmarks/dispatch.py``, ``ScalarReads``), on CUDA
the runtime's synchronising calls, the operation counts of a plain timm model of the
student's architecture (the floor: forward and backward of the same batch), the top operations
by time and a chrome trace (``--trace``).

    python benchmarks/profile_step.py                          # the quickstart on CPU, ~1 min
    python benchmarks/profile_step.py --config configs/stage1.yaml --teacher-depth 2 \\
        --trainer.accelerator=cpu --trainer.devices=1 --trainer.strategy=auto \\
        --trainer.precision=32-true --data=radio_lit.data.ImageFolderDataModule \\
        --data.train_dir=radio_lit:sample_images --data.crop_size=384 --data.batch_size=2
    python benchmarks/profile_step.py --config configs/stage1.yaml --device cuda ...  # a GPU

Operation counts do not depend on the machine's load; CPU times do (say so when quoting them).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import inspect
import json
import resource
import statistics
import sys
import tempfile
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.dispatch import ScalarReads, count_events  # noqa: E402

#: Dense bf16 tensor-core peaks (TFLOP/s) from the vendors' data sheets, by device-name part.
GPU_PEAK_TFLOPS = {
    "H200": 989.0,
    "H100 SXM": 989.0,
    "H100 80GB HBM3": 989.0,
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "GH200": 989.0,
    "B200": 2250.0,
    "A100": 312.0,
    "L40S": 362.0,
    "A10": 125.0,
    "L4": 121.0,
}
#: segment-anything's ``build_sam_vit_*`` encoders (what ``SAMTeacher(model_type)`` builds).
SAM_ENCODERS = {
    kind: dict(
        img_size=1024,
        patch_size=16,
        embed_dim=width,
        depth=depth,
        num_heads=16 if width > 768 else 12,
        mlp_ratio=4.0,
        out_chans=256,
        qkv_bias=True,
        use_rel_pos=True,
        window_size=14,
        global_attn_indexes=globals_,
    )
    for kind, width, depth, globals_ in (
        ("vit_b", 768, 12, [2, 5, 8, 11]),
        ("vit_l", 1024, 24, [5, 11, 17, 23]),
        ("vit_h", 1280, 32, [7, 15, 23, 31]),
    )
}
OTHER = "Lightning + logging"
SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")
SCALAR_READS = ("aten::_local_scalar_dense",)


# ------------------------------------------------------------------------------------------
# command line and building
# ------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Other arguments (--model.*, --trainer.*, --data...) go to radio-lit's parser.",
    )
    parser.add_argument("--config", default=str(ROOT / "configs" / "quickstart.yaml"))
    parser.add_argument("--steps", type=int, default=3, help="timed steps (median; default 3)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed first steps (default 2)")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--teacher-depth",
        type=int,
        default=None,
        help="shorten every teacher to this many blocks, widths kept (CPU runs of real configs)",
    )
    parser.add_argument(
        "--pretrained",
        action="store_true",
        help="keep the config's pretrained weights (default: random weights, nothing loaded)",
    )
    parser.add_argument("--trace", default=None, help="chrome trace of the profiled step (.json)")
    parser.add_argument("--top", type=int, default=12, help="top operations by time to print")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    args, overrides = parser.parse_known_args(argv)
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1")
    return args, overrides


def _teacher_overrides(name: str, entry: dict[str, Any], args: argparse.Namespace) -> list[str]:
    """Random weights and, with ``--teacher-depth``, fewer blocks for one teacher entry."""
    key = f"--model.teachers.{name}.init_args"
    init = entry.get("init_args") or {}
    kind = entry["class_path"].rsplit(".", 1)[-1]
    parameters = _init_parameters(entry["class_path"])
    out = []
    if not args.pretrained:
        pretrained = init.get("pretrained", getattr(parameters.get("pretrained"), "default", None))
        if pretrained not in (None, False, inspect.Parameter.empty):
            out.append(f"{key}.pretrained={'false' if pretrained is True else 'null'}")
        if init.get("checkpoint"):
            out.append(f"{key}.checkpoint=null")
        if isinstance(init.get("model"), str) and "." in init["model"] and kind != "RADIOTeacher":
            out.append(f"{key}.model={init['model'].split('.')[0]}")  # no pretrained tag
    depth = args.teacher_depth
    if depth is None:
        return out
    if kind == "OpenCLIPTeacher":
        import open_clip

        cfg = init.get("model_cfg") or open_clip.get_model_config(init["model_name"])
        if "timm_model_name" in cfg["vision_cfg"]:  # a timm trunk: shorten_trunk, once built
            return out
        cfg = {**cfg, "vision_cfg": {**cfg["vision_cfg"], "layers": depth}}
        cfg["text_cfg"] = {**cfg["text_cfg"], "layers": min(depth, cfg["text_cfg"]["layers"])}
        out.append(f"{key}.model_cfg={json.dumps(cfg)}")
    elif kind == "SAMTeacher":
        kwargs = init.get("encoder_kwargs") or SAM_ENCODERS[init["model_type"]]
        kwargs = {**kwargs, "depth": depth, "global_attn_indexes": [depth - 1]}
        out += [f"{key}.model_type=null", f"{key}.encoder_kwargs={json.dumps(kwargs)}"]
    elif "model_kwargs" in parameters:
        kwargs = {**(init.get("model_kwargs") or {}), "depth": depth}
        out.append(f"{key}.model_kwargs={json.dumps(kwargs)}")
    else:
        print(f"note: teacher {name} ({kind}) kept at full depth")
    return out


def _init_parameters(class_path: str) -> Mapping[str, inspect.Parameter]:
    module, name = class_path.rsplit(".", 1)
    return inspect.signature(getattr(importlib.import_module(module), name)).parameters


def return_freed_memory() -> None:
    """Let glibc give freed tensors back to the OS at once (allocations of 64 KiB and more are
    mapped, the threshold fixed): a built-then-shortened teacher (SigLIP2-g: 4 GiB) does not
    stay resident while the steps run, nor ``train_step.py``'s first side while its second
    runs (CPU machines)."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("c")
    if sys.platform.startswith("linux") and name:
        ctypes.CDLL(name).mallopt(-3, 65536)  # M_MMAP_THRESHOLD


def on_device(args: argparse.Namespace) -> contextlib.AbstractContextManager[Any]:
    """Where :func:`build` creates the models' tensors: on a GPU (``--device cuda``) the
    default device is the GPU, so that random initialisation of billions of teacher and
    student weights runs there (tens of seconds per recipe on the host's cores otherwise);
    ``args.build_on_host`` (or a CPU run) keeps the host. A library that moves its model back
    to the host itself (open_clip's ``create_model``) is moved to the GPU by the Trainer."""
    import torch

    if args.device != "cuda" or getattr(args, "build_on_host", False):
        return contextlib.nullcontext()
    return torch.device("cuda")


def build(args: argparse.Namespace, overrides: list[str], extra_steps: int = 4) -> Any:
    """The ``RadioLitCLI`` of the config with random weights and the profiler's overrides,
    its models created on the run's device (:func:`on_device`); ``max_steps`` is
    ``--warmup + --steps + extra_steps``; its evaluation measures are left out of the trainer.
    With ``--teacher-depth``, teachers whose config cannot set their depth (open_clip's timm
    trunks) are shortened once built."""
    import yaml

    from radio_lit.cli.app import RadioLitCLI
    from radio_lit.evaluation.base import Evaluation

    config = yaml.safe_load(Path(args.config).read_text())
    model = config.get("model", {})
    extra = []
    for name, entry in (model.get("teachers") or {}).items():
        extra += _teacher_overrides(name, entry, args)
    student = (model.get("student") or {}).get("init_args") or {}
    if not args.pretrained and student.get("pretrained"):
        extra.append("--model.student.init_args.pretrained=false")
    root = tempfile.mkdtemp(prefix="profile_step_")
    extra += [
        # profile_step: + the profiled step, the scalar-read step, a gap, the FLOP step
        f"--trainer.max_steps={args.warmup + args.steps + extra_steps}",
        f"--trainer.default_root_dir={root}",
        "--trainer.enable_model_summary=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.limit_val_batches=0",
        f"--trainer.accelerator={args.device}",
    ]
    if config.get("trainer", {}).get("logger"):
        extra.append(f"--trainer.logger.init_args.save_dir={root}")
    with on_device(args):
        cli = RadioLitCLI(run=False, args=["--config", args.config, *extra, *overrides])
    # The config's evaluation measures are built (their errors are the config's) but not run:
    # they run at the end of fit, after the steps measured here.
    cli.trainer.callbacks[:] = [c for c in cli.trainer.callbacks if not isinstance(c, Evaluation)]
    if args.teacher_depth is not None:
        for name, teacher in cli.model.teachers.items():
            shorten_trunk(name, teacher, args.teacher_depth)
    return cli


def shorten_trunk(name: str, teacher: Any, depth: int) -> None:
    """Keep the first ``depth`` blocks of an open_clip teacher's timm trunk (SigLIP's: open_clip
    builds it at the timm model's own depth, which its config cannot set); widths kept."""
    trunk = getattr(getattr(teacher, "model", None), "trunk", None)
    blocks = getattr(trunk, "blocks", None)
    if blocks is not None and len(blocks) > depth:
        trunk.blocks = blocks[:depth]
        if isinstance(getattr(trunk, "feature_info", None), list):
            trunk.feature_info = trunk.feature_info[:depth]
        print(f"note: teacher {name} (open_clip timm trunk) shortened to {depth} blocks once built")


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

            mapping = _cpu_sdpa_mapping()
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


def _cpu_sdpa_mapping() -> dict[Any, Any]:
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


def _launches(events: list[Any]) -> int:
    return sum(1 for e in events if "LaunchKernel" in e.name)


def _syncs(events: list[Any]) -> int:
    return sum(1 for e in events if e.name in SCALAR_READS or e.name in SYNC_CALLS)


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
    read and write (source and destination, each ``numel x element size``)."""
    copies = casts = moved = 0
    for event in events:
        if event.name == "aten::_to_copy":
            casts += 1
        elif event.name == "aten::copy_":
            copies += 1
            shapes = event.input_shapes or []
            # torch 2.11's profiler records no dtypes: 4 bytes an element then
            dtypes = getattr(event, "input_dtypes", None) or [None] * len(shapes)
            for shape, dtype in list(zip(shapes, dtypes, strict=False))[:2]:
                numel = 1
                for side in shape:
                    numel *= side
                moved += numel * ELEMENT_BYTES.get(dtype, 4)
    return copies, casts, moved


def device_peak(device: Any) -> tuple[float, str]:
    """Peak TFLOP/s of ``device``: a known GPU's dense bf16 figure, else a measured matmul."""
    import torch

    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for key, peak in GPU_PEAK_TFLOPS.items():
            if key in name:
                return peak, f"{name}, dense bf16 data-sheet peak"
        dtype, label = torch.bfloat16, f"{name}, measured bf16 matmul"
    else:
        dtype, label = torch.float32, "CPU, measured float32 matmul"
    n = 2048 if device.type == "cpu" else 8192
    a = torch.randn(n, n, device=device, dtype=dtype)
    for _ in range(2):
        a @ a
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    start, repeats = time.perf_counter(), 3 if device.type == "cpu" else 20
    for _ in range(repeats):
        a @ a
    sync()
    return 2 * n**3 * repeats / (time.perf_counter() - start) / 1e12, label


def floor_counts(cli: Any, batch: int, device: Any) -> tuple[Any, ...] | None:
    """Operations (and CUDA launches) of a plain timm model of the student's architecture:
    forward and backward on the student's batch, or None for a non-timm student."""
    import timm
    import torch

    init = cli.config.model.student.init_args
    if cli.config.model.student.class_path.rsplit(".", 1)[-1] != "CPEViT":
        return None
    size = cli.model.student_resolution
    plain = timm.create_model(
        init.model, pretrained=False, num_classes=0, img_size=size, **(init.model_kwargs or {})
    ).to(device)
    images = torch.randn(batch, 3, *size, device=device)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    plain(images).sum().backward()  # warm-up
    with torch.profiler.profile(activities=activities) as forward:
        out = plain(images)
    loss = out.float().sum()
    with torch.profiler.profile(activities=activities) as backward:
        loss.backward()
    f, b = list(forward.events()), list(backward.events())
    return count_events(f), _launches(f), count_events(b), _launches(b)


def vit_forward_flops(model: str, size: tuple[int, int], **kwargs: Any) -> tuple[float, float]:
    """One image's forward FLOPs of a plain timm ViT, counted by ``FlopCounterMode`` (on the
    meta device: shapes only), and the estimate ``2 * params * tokens + attention`` with
    attention ``4 * tokens^2 * width`` per block (QK^T and AV). Position embeddings and tokens
    are not matmul weights and are left out of ``params``."""
    import timm
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    with torch.device("meta"):
        vit = timm.create_model(model, pretrained=False, num_classes=0, img_size=size, **kwargs)
        images = torch.empty(1, 3, *size)
    with FlopCounterMode(display=False) as counter:
        vit(images)
    skip = ("pos_embed", "cls_token", "reg_token")
    params = sum(p.numel() for n, p in vit.named_parameters() if not n.startswith(skip))
    tokens = vit.patch_embed.num_patches + vit.num_prefix_tokens
    attention = 4 * tokens**2 * vit.embed_dim * len(vit.blocks)
    return float(counter.get_total_flops()), float(2 * params * tokens + attention)


def scalar_reads_report(reads: ScalarReads, cuda: bool) -> str:
    """The profiled step's scalar reads: those of device tensors (host-device
    synchronisations on a GPU) and those of host tensors, each by where it is made."""
    device = Counter(read.where for read in reads.reads if read.on_device)
    host = Counter(read.where for read in reads.reads if not read.on_device)
    basis = "" if cuda else " on a GPU (device tensors followed by provenance on this CPU)"
    lines = [
        f"scalar reads per step (.item() and the like): {len(reads.reads)}",
        f"  of device tensors, host-device synchronisations{basis}: {sum(device.values())}",
        *(f"    {count} at {where}" for where, count in device.most_common()),
        f"  of host tensors, no synchronisation: {sum(host.values())}",
        *(f"    {count} at {where}" for where, count in host.most_common(8)),
    ]
    return "\n".join(lines)


def _row(cells: list[Any], widths: list[int]) -> str:
    return "  ".join(
        str(c).rjust(w) if i else str(c).ljust(w)
        for i, (c, w) in enumerate(zip(cells, widths, strict=True))
    )


def report(args: argparse.Namespace, cli: Any, driver: Driver, notes: list[str]) -> None:
    import torch

    device = driver.device
    events = list(driver.profile.events())
    by_phase = attribute(events)
    peak, peak_label = device_peak(device)
    phases = sorted({*by_phase, *driver.phase_times[0], *driver.step_flops} - {"total"})
    median = {p: statistics.median(t.get(p, 0.0) for t in driver.phase_times) for p in phases}
    step_time = statistics.median(driver.step_times)
    median[OTHER] = max(0.0, step_time - sum(v for k, v in median.items() if k != OTHER))
    cuda = device.type == "cuda"
    header = ["phase", "ms", "aten top", "aten all"] + (["launches"] if cuda else [])
    header += ["syncs", "GFLOP", "TFLOP/s", "% peak"]
    widths = [22, 9, 9, 9] + ([9] if cuda else []) + [6, 10, 8, 7]
    print("\n" + _row(header, widths))
    totals: Counter[str] = Counter()
    for phase in sorted(phases, key=lambda p: -median.get(p, 0.0)):
        count = count_events(by_phase.get(phase, []))
        flops = driver.step_flops.get(phase, 0.0)
        seconds = median.get(phase, 0.0)
        rate = flops / seconds / 1e12 if seconds > 0 else 0.0
        cells = [phase, f"{seconds * 1e3:.1f}", count.top_level, count.total]
        cells += [_launches(by_phase.get(phase, []))] if cuda else []
        cells += [
            _syncs(by_phase.get(phase, [])),
            f"{flops / 1e9:.2f}",
            f"{rate:.3f}",
            f"{100 * rate / peak:.1f}",
        ]
        print(_row(cells, widths))
        totals.update(top=count.top_level, all=count.total)
    flops = driver.step_flops.get("total", 0.0)
    rate = flops / step_time / 1e12
    cells = ["step", f"{step_time * 1e3:.1f}", totals["top"], totals["all"]]
    cells += [_launches(events)] if cuda else []
    cells += [_syncs(events), f"{flops / 1e9:.2f}", f"{rate:.3f}", f"{100 * rate / peak:.1f}"]
    print(_row(cells, widths))
    batch = driver.batch_shape[0] if driver.batch_shape else 0
    steps = len(driver.step_times)
    print(f"\nimages/s: {batch / step_time:.2f} (batch {batch}, median of {steps} steps)")
    print(f"peak: {peak:.2f} TFLOP/s ({peak_label})")
    if cuda:
        memory = torch.cuda.max_memory_allocated(device) / 2**30
        print(f"peak memory: {memory:.2f} GiB allocated on the device")
    else:
        memory = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        print(f"peak memory: {memory:.2f} GiB resident (the process's peak)")
    syncs = sum(1 for e in events if e.name in SYNC_CALLS)
    print(scalar_reads_report(driver.scalar_reads, cuda))
    if cuda:
        print(f"synchronising CUDA runtime calls per step: {syncs}")
    floor = floor_counts(cli, batch, device)  # the step's images (one partition)
    if floor is None:
        print("floor: n/a (the student is not a timm ViT)")
    else:
        forward = count_events(by_phase.get("student forward", []))
        backward = count_events(by_phase.get("backward", []))
        f, f_launch, b, b_launch = floor
        init = cli.config.model.student.init_args
        line = (
            f"floor (plain timm {cli.config.model.student.init_args.model}, same batch): "
            f"forward {f}, backward {b}"
        )
        if cuda:
            line += f"; launches forward {f_launch}, backward {b_launch}"
        print(line)
        counted, estimate = vit_forward_flops(
            init.model, cli.model.student_resolution, **(init.model_kwargs or {})
        )
        print(
            f"floor forward FLOPs per image: {counted / 1e9:.2f} G counted, "
            f"{estimate / 1e9:.2f} G by 2 * params * tokens + attention ({counted / estimate:.3f}x)"
        )
        print(
            f"student forward / floor: {forward.top_level / f.top_level:.2f}x top-level; "
            f"the step's backward (student, heads, losses) / floor backward: "
            f"{backward.top_level / b.top_level:.2f}x"
        )
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    print(f"\ntop {args.top} operations by {sort}:")
    print(driver.profile.key_averages().table(sort_by=sort, row_limit=args.top))
    if args.trace:
        driver.profile.export_chrome_trace(args.trace)
        print(f"chrome trace: {args.trace}")
    for note in notes:
        print(f"note: {note}")


def main(argv: list[str] | None = None) -> None:
    import logging
    import warnings

    import torch

    args, overrides = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    warnings.filterwarnings("ignore")
    return_freed_memory()
    cli = build(args, overrides)
    for name in ("lightning.pytorch", "lightning.fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    clock = PhaseClock(sync)
    instrument(cli, clock)
    driver = Driver(args, clock, device)
    cli.trainer.callbacks.append(driver.callback())
    driver.time_data(cli.datamodule)
    notes = [] if args.pretrained else ["random weights (nothing loaded)"]
    if args.teacher_depth is not None:
        notes.append(f"teachers shortened to {args.teacher_depth} blocks, widths kept")
    notes.append(
        f"CPU times on this machine ({torch.get_num_threads()} threads) move with its load; "
        "operation counts do not"
        if device.type == "cpu"
        else "times device-synchronised at every phase boundary"
    )
    try:
        cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    finally:
        uninstrument()
    report(args, cli, driver, notes)


if __name__ == "__main__":
    main()
