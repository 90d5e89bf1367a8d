"""radio-lit's training step against a plain PyTorch loop, phase by phase, for any config.

Both sides are built from one config by radio-lit's own parser at the config's real widths with
random weights (``benchmarks/harness.py``'s ``build``: pretrained tags and checkpoints
dropped; ``--teacher-depth K`` shortens every teacher to K blocks, widths kept), and train on
one batch of the config's data, in one process, their phases labelled by
``benchmarks/phases.py`` as ``profile_step.py``'s:

* **radio-lit**: the config's own Trainer fits the ``DistillationModule`` with the config's
  callbacks less those that change what a steady-state step does or need a logger (statistics
  estimation, trunk freezing, checkpoints, LR monitor, evaluation); no logger;
* **plain PyTorch**: a loop written without radio-lit's step code: the same teacher modules
  called through their libraries' own forwards (open_clip ``visual.forward_intermediates``,
  timm ``forward_features``, segment-anything's ``ImageEncoderViT`` with its own attention,
  transformers ``model(pixel_values=...)``), frozen teachers in their own dtype on inputs of
  that dtype, without autocast, under ``torch.no_grad``; views by ``F.interpolate(...,
  antialias=True)``; the fitted normalizers' affine map ``(y - mu) W^T``; copies of the same
  student (with its σReparam step) and heads at their initial weights, under bf16 autocast when
  the trainer's precision is ``bf16-mixed``; student maps resized to each teacher's grid;
  ``F.mse_loss`` and ``1 - F.cosine_similarity`` with the config's weights; ``backward``; a fused
  ``torch.optim.AdamW`` with the configured optimizer's learning rate, betas, epsilon and weight
  decay over the same parameter groups (torch has no fused LAMB: AdamW is the nearest fused
  library optimizer; the configured one is named in the output); the same LR schedule.

The normalizers are fitted once on the batch before either side runs. Each side runs
``--warmup`` untimed steps, ``--steps`` timed steps (phase boundaries device-synchronised on
CUDA) and one profiled step (``torch.profiler`` with shapes), first radio-lit, then the plain
loop, from the same initial weights and random state (so their first losses agree). Printed per
phase, radio-lit beside plain: median ms, top-level aten operations, ``aten::copy_`` calls (nested
ones included), ``aten::_to_copy`` calls (casts), the megabytes those copies read and write, and
(CUDA) kernel launches; then the first losses, and last the line
``ratio (radio-lit / plain PyTorch): X.XX`` (median step times).

On ``--device cpu`` a config written for GPUs is run on one CPU process: one device, strategy
``auto``, precision ``32-true`` and float32 teachers (bf16 matrix products are ~50x slower than
float32 on CPUs without bf16 instructions), the shipped photographs at the config's crop size,
batch 2 (``--batch-size``). On ``--device cuda``: one GPU, the config's precision and teacher
dtypes. Any ``--model.* --trainer.* --data*`` argument overrides these.

    python benchmarks/train_step.py                                   # the quickstart, CPU
    python benchmarks/train_step.py --config configs/stage1.yaml --teacher-depth 1   # CPU
    python benchmarks/train_step.py --config configs/stage1.yaml --device cuda       # one GPU

Operation, copy and byte counts do not depend on the machine's load; CPU times do.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import math
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402
from benchmarks.dispatch import count_events  # noqa: E402
from benchmarks.phases import (  # noqa: E402
    OTHER,
    Driver,
    PhaseClock,
    attribute,
    copy_counts,
    instrument,
    start_profile,
    uninstrument,
)

#: Callbacks of a config that radio-lit's side keeps (the rest change what a steady-state step
#: does, write files or need a logger).
KEPT_CALLBACKS = (
    "NonFiniteGuard",
    "TrainingProgressGuard",
    "RandomStates",
    "SkippedData",
    "ImagesPerSecond",
)
#: The row of what no named phase covers: Lightning, logging and callbacks; the plain loop's own
#: lines (batch to the device, zero_grad, scheduler).
REST = "rest of the step"
LOCAL_DATA = ("ImageFolderDataModule", "SyntheticDataModule")
#: Operations listed per phase where the sides differ.
LISTED = 8


# ------------------------------------------------------------------------------------------
# command line and building
# ------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    parser = harness.step_arguments(__doc__, "timed steps per side (default 3)")
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="images per step (default: the config's; 2 on a CPU when its data is replaced)",
    )
    parser.add_argument("--seed", type=int, default=0, help="random state of both first steps")
    parser.add_argument(
        "--teachers-on-fake-cuda",
        action="store_true",
        help="instead: each teacher of the config at full size, radio-lit's call under bf16 "
        "autocast against the plain library call, counted on fake CUDA tensors (no GPU)",
    )
    args, overrides = parser.parse_known_args(argv)
    if args.steps < 1 or args.warmup < 1:
        parser.error("--steps and --warmup must be >= 1")
    if not Path(args.config).is_file():
        parser.error(f"config {args.config} not found; pass --config PATH")
    return args, overrides


def device_overrides(
    config: dict[str, Any], args: argparse.Namespace
) -> tuple[list[str], list[str]]:
    """Overrides that run ``config`` on one device of ``args.device`` (module docstring), and
    notes saying what they changed: on a CPU one process in float32, on CUDA one rank of the
    config's strategy; a config whose data is not local gets the shipped photographs."""
    cpu = args.device == "cpu"
    strategy = "auto" if cpu else "one rank"
    out, notes = harness.one_device(config, strategy=strategy, float32=cpu)
    data = config.get("data") or {}
    batch = args.batch_size
    if not str(data.get("class_path", "")).endswith(LOCAL_DATA):
        crop = (data.get("init_args") or {}).get("crop_size", 384)
        if batch is None and cpu:
            batch = 2
        out += harness.photographs(crop, batch)
        notes.append(f"data: the shipped photographs, {crop} px crops")
    elif batch is not None:
        out.append(f"--data.init_args.batch_size={batch}")
    return out, notes


# ------------------------------------------------------------------------------------------
# plain side: the libraries' own forwards
# ------------------------------------------------------------------------------------------
TeacherForward = Callable[[Any], tuple[Any, Any]]


def library_forward(teacher: Any) -> tuple[TeacherForward, str]:
    """``(forward, label)``: ``forward(view)`` runs ``teacher``'s encoder through its library's
    own API on a normalized view in the teacher's dtype and returns ``(summary [B, C] or None,
    features [B, h, w, C])``, as the teacher defines them; ``label`` says which API."""
    from radio_lit.teachers import OpenCLIPTeacher, SAMTeacher
    from radio_lit.teachers.tokens import TokenTeacher

    if isinstance(teacher, OpenCLIPTeacher):
        visual = teacher.model

        def open_clip_forward(view: Any) -> tuple[Any, Any]:
            out = visual.forward_intermediates(
                view, indices=1, normalize_intermediates=True, output_fmt="NCHW"
            )
            return out["image_features"], out["image_intermediates"][-1].permute(0, 2, 3, 1)

        return open_clip_forward, "open_clip visual.forward_intermediates"
    if isinstance(teacher, SAMTeacher):
        return sam_forward(teacher), "segment-anything ImageEncoderViT, its own attention"
    if isinstance(teacher, TokenTeacher):
        if getattr(teacher, "backend", "timm") == "timm" and hasattr(
            teacher.model, "forward_features"
        ):
            return timm_forward(teacher), "timm forward_features"
        return transformers_forward(teacher), "transformers model(pixel_values=...)"
    return (lambda view: _encode(teacher, view)), f"radio-lit's {type(teacher).__name__}.encode"


def _encode(teacher: Any, view: Any) -> tuple[Any, Any]:
    out = teacher.encode(view)
    return out.summary, out.features


def timm_forward(teacher: Any) -> TeacherForward:
    net, patch = teacher.model, teacher.patch_size
    prefix, summary = net.num_prefix_tokens, teacher.summary_source

    def forward(view: Any) -> tuple[Any, Any]:
        tokens = net.forward_features(view)
        batch, _, height, width = view.shape
        features = tokens[:, prefix:].reshape(batch, height // patch, width // patch, -1)
        if summary == "cls":
            return tokens[:, 0], features
        if summary == "pooled":
            return net.forward_head(tokens, pre_logits=True), features
        return None, features

    return forward


def transformers_forward(teacher: Any) -> TeacherForward:
    import inspect

    net, patch, summary = teacher.model, teacher.patch_size, teacher.summary_source
    native = getattr(net.config, "image_size", None)
    interpolate = "interpolate_pos_encoding" in inspect.signature(net.forward).parameters

    def forward(view: Any) -> tuple[Any, Any]:
        batch, _, height, width = view.shape
        kwargs = {}
        if interpolate and native is not None and (height, width) != (native, native):
            kwargs["interpolate_pos_encoding"] = True
        out = net(pixel_values=view, **kwargs)
        tokens = out.last_hidden_state
        cells = (height // patch) * (width // patch)
        features = tokens[:, tokens.shape[1] - cells :].reshape(
            batch, height // patch, width // patch, -1
        )
        if summary == "cls":
            return tokens[:, 0], features
        if summary == "pooled":
            return out.pooler_output, features
        return None, features

    return forward


@contextlib.contextmanager
def library_classes(encoder: Any) -> Iterator[None]:
    """segment-anything's own module classes inside ``encoder`` while the block runs (radio-lit
    gives some of its modules subclasses with other forwards: same parameters, same state)."""
    from segment_anything.modeling import image_encoder

    swapped = []
    for module in encoder.modules():
        for base in type(module).__mro__[1:]:
            if getattr(image_encoder, base.__name__, None) is base:
                swapped.append((module, type(module)))
                module.__class__ = base
                break
    try:
        yield
    finally:
        for module, cls in swapped:
            module.__class__ = cls


def sam_forward(teacher: Any) -> TeacherForward:
    """segment-anything's ``ImageEncoderViT`` (features before the neck, as radio-lit takes
    them) on views padded to its input or packed ``k x k`` per mosaic (RADIOv2.5 4.3)."""
    import torch.nn.functional as F

    encoder, canvas, patch = teacher.model, teacher.canvas, teacher.patch_size

    def forward(view: Any) -> tuple[Any, Any]:
        batch, _, height, width = view.shape
        k = canvas // height if teacher.mosaic and height == width else 1
        with library_classes(encoder):
            if k == 1:
                padded = F.pad(view, (0, canvas - width, 0, canvas - height))
                features = encoder(padded).permute(0, 2, 3, 1)
                return None, features[:, : height // patch, : width // patch]
            tile = canvas // k // patch * patch
            count = -(-batch // (k * k))
            tiles = F.pad(view, (0, tile - width, 0, tile - height, 0, 0, 0, count * k * k - batch))
            grid = tiles.reshape(count, k, k, 3, tile, tile).permute(0, 3, 1, 4, 2, 5)
            rest = canvas - k * tile
            mosaics = F.pad(grid.reshape(count, 3, k * tile, k * tile), (0, rest, 0, rest))
            maps = encoder(mosaics).permute(0, 2, 3, 1)  # [count, G, G, C]
        cells, side = tile // patch, height // patch
        maps = maps[:, : k * cells, : k * cells].reshape(count, k, cells, k, cells, -1)
        per_view = maps.permute(0, 1, 3, 2, 4, 5).reshape(count * k * k, cells, cells, -1)
        return None, per_view[:batch, :side, :side]

    return forward


def lr_multiplier(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up to 1, then cosine annealing to ``min_ratio`` (the configured schedule)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class PlainStep:
    """The plain loop of the module docstring for ``module``'s configuration (one partition,
    MSE feature and cosine summary losses, fixed weights; C-RADIO's shifts, DAMP and MESA have
    no plain counterpart and are refused). Built before radio-lit trains: its student and heads
    are copies of the initial weights; the teachers are shared (frozen)."""

    def __init__(self, module: Any, batch: Any, device: Any, precision: str, total: int) -> None:
        import torch

        from radio_lit.losses import MSE, Cosine, Weighted
        from radio_lit.training.optim import parameter_groups

        problems = []
        if len(module.partitions.partitions) != 1:
            problems.append("more than one model.partitions entry")
        if type(module.feature_loss) is not MSE or type(module.summary_loss) is not Cosine:
            problems.append("losses other than MSE (features) and Cosine (summaries)")
        if type(module.balancer) is not Weighted:
            problems.append(f"balancer {type(module.balancer).__name__}")
        step = module.student_step
        if step.shifts is not None or step.damp is not None or step.mesa is not None:
            problems.append("model.shifts / damp / mesa")
        if precision not in ("32-true", "32", "bf16-mixed"):
            problems.append(f"precision {precision}")
        if problems:
            raise SystemExit("the plain loop does not implement: " + "; ".join(problems))
        self.device, self.batch = device, batch
        self.mixed = precision == "bf16-mixed"
        self.student = copy.deepcopy(module.student).train()
        self.heads = copy.deepcopy(module.heads).train()
        self.teachers = dict(module.teachers.items())
        self.forwards, self.apis = {}, {}
        for name, teacher in self.teachers.items():
            self.forwards[name], self.apis[name] = library_forward(teacher)
        self.size = tuple(module.student_resolution)
        grid = (
            self.size[0] // module.student.patch_size,
            self.size[1] // module.student.patch_size,
        )
        self.sizes = {n: tuple(t.view_size(grid)) for n, t in self.teachers.items()}

        def channel(values: Any) -> Any:
            return torch.tensor(values, dtype=torch.float32, device=device).view(1, 3, 1, 1)

        self.pixels = {n: (channel(t.mean), channel(t.std)) for n, t in self.teachers.items()}
        self.student_pixels = tuple(map(channel, module.conditioner.values))
        self.affine = {}  # name -> (mu, W, elementwise), or None: the identity
        for name, normalizer in module.normalizers.items():
            if not normalizer.requires_statistics:
                self.affine[name] = None
                continue
            self.affine[name] = (
                normalizer.shift.float().clone(),
                normalizer.weight.float().clone(),
                normalizer.elementwise,
            )
        self.token = dict(module.summary_token)
        self.feature_weights = dict(module.feature_weights)
        self.summary_weights = dict(module.summary_weights)

        named = [*self.student.named_parameters(prefix="student"), *self.heads.named_parameters()]
        groups = parameter_groups(named)
        configured = module.optimizer_factory(groups)
        self.configured = type(configured).__name__
        d = configured.defaults
        self.optimizer = torch.optim.AdamW(
            parameter_groups(named),
            lr=d["lr"],
            betas=tuple(d.get("betas", (0.9, 0.999))),
            eps=d.get("eps", 1e-8),
            weight_decay=d.get("weight_decay", 0.0),
            fused=True,
        )
        del configured
        warmup, min_ratio = module.warmup_steps, module.min_lr_ratio
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: lr_multiplier(s, warmup, total, min_ratio)
        )

    def step(self, number: int, clock: PhaseClock) -> Any:
        """One training step; phases labelled on ``clock``. Returns the loss (detached)."""
        import torch
        import torch.nn.functional as F

        from radio_lit.students.spectral_reparam import spectral_step
        from radio_lit.training.random_streams import RankStream
        from radio_lit.training.student_step import FORWARD_STREAM, run_seed

        device = self.device
        batch = self.batch.to(device, non_blocking=True)
        with clock.phase("views"):
            crop = batch.float().div_(255.0) if batch.dtype == torch.uint8 else batch
            resized = {}
            for size in {self.size, *self.sizes.values()}:
                resized[size] = (
                    crop
                    if tuple(crop.shape[-2:]) == size
                    else F.interpolate(
                        crop, size=size, mode="bilinear", align_corners=False, antialias=True
                    )
                )
        outputs, targets = {}, {}
        with torch.no_grad():
            for name, teacher in self.teachers.items():
                with clock.phase(f"teacher {name}"):
                    mean, std = self.pixels[name]
                    view = (resized[self.sizes[name]] - mean) / std
                    dtype = next(teacher.parameters()).dtype
                    if teacher.channels_last:
                        view = view.contiguous(memory_format=torch.channels_last)
                    summary, features = self.forwards[name](view.to(dtype))
                    outputs[name] = (None if summary is None else summary.float(), features.float())
            with clock.phase("normalizers"):
                for name, (_, features) in outputs.items():
                    affine = self.affine[name]
                    if affine is None:
                        targets[name] = features
                    else:
                        shift, weight, elementwise = affine
                        centered = features - shift
                        targets[name] = centered * weight if elementwise else centered @ weight.T
        self.student.begin_step(run_seed(), number)
        loss = torch.zeros((), device=device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.mixed):
            with clock.phase("views"):
                mean, std = self.student_pixels
                view = (resized[self.size] - mean) / std
            if number == 0:  # the CPE windows and dropout of rank 0's training forwards
                self.stream = RankStream(FORWARD_STREAM)
                self.stream.start(run_seed(), 0)
            forward, stream = clock.phase("student forward"), self.stream.active(device)
            with spectral_step(self.student), forward, stream:
                student = self.student(view)
            for name, (summary_target, _) in outputs.items():
                heads, target = self.heads[name], targets[name]
                summary = token = None
                if heads.summary is not None and summary_target is not None:
                    with clock.phase("grid matching"):  # where radio-lit picks the token
                        token = student.summary[:, self.token[name]]
                with clock.phase(f"head {name}"):
                    prediction = heads.features(student.features)
                    if token is not None:
                        summary = heads.summary(token)
                with clock.phase("grid matching"):
                    if prediction.shape[1:3] != target.shape[1:3]:
                        prediction = F.interpolate(
                            prediction.permute(0, 3, 1, 2),
                            size=tuple(target.shape[1:3]),
                            mode="bilinear",
                            align_corners=False,
                            antialias=True,
                        ).permute(0, 2, 3, 1)
                with clock.phase("losses"):
                    term = F.mse_loss(prediction.float(), target)
                    loss = loss + self.feature_weights[name] * term
                    if summary is not None:
                        cosine = F.cosine_similarity(summary.float(), summary_target, dim=-1)
                        loss = loss + self.summary_weights[name] * (1.0 - cosine).mean()
        with clock.phase("backward"):
            loss.backward()
        with clock.phase("optimizer"):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return loss.detach()


# ------------------------------------------------------------------------------------------
# the two sides
# ------------------------------------------------------------------------------------------
@dataclass
class Side:
    """One side's measurements: per-step times, per-step phase times, the profiled step's
    events, its first loss."""

    step_times: list[float] = field(default_factory=list)
    phase_times: list[dict[str, float]] = field(default_factory=list)
    events: list[Any] = field(default_factory=list)
    first_loss: float = float("nan")


def run_radio_lit(cli: Any, args: argparse.Namespace, batch: Any, device: Any) -> Side:
    """``Trainer.fit`` of the built module on ``batch``; the profiler's phases and driver."""
    import lightning.pytorch as pl
    import torch

    side = Side()
    clock = PhaseClock(harness.synchronizer(device))
    instrument(cli, clock)
    driver = Driver(args, clock, device, extras=())
    seed = args.seed

    class FirstStep(pl.Callback):
        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            torch.manual_seed(seed)  # the plain loop's first step draws the same numbers

        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, *_: Any) -> None:
            if trainer.global_step == 1:
                side.first_loss = float(outputs["loss"])

    trainer = cli.trainer
    trainer.callbacks[:] = [c for c in trainer.callbacks if type(c).__name__ in KEPT_CALLBACKS]
    trainer.callbacks += [FirstStep(), driver.callback()]
    total = args.warmup + args.steps + 2
    try:
        trainer.fit(cli.model, train_dataloaders=harness.in_memory([batch] * (total + 1)))
    finally:
        uninstrument()
    side.step_times, side.phase_times = driver.step_times, driver.phase_times
    side.events = list(driver.profile.events())
    for optimizer in trainer.optimizers:  # its state and weights are not needed any more
        optimizer.state.clear()
    with contextlib.suppress(RuntimeError):  # FSDP2's sharded parameters cannot move
        cli.model.student.to("meta")
        cli.model.heads.to("meta")
    return side


def run_plain(plain: PlainStep, args: argparse.Namespace, device: Any) -> Side:
    """The plain loop: warm-up, timed and profiled steps, as radio-lit's side."""
    import torch

    side, sync = Side(), harness.synchronizer(device)
    clock = PhaseClock(sync)
    timed = args.warmup + args.steps
    torch.manual_seed(args.seed)
    for number in range(timed + 1):
        mode = "time" if args.warmup <= number < timed else ("profile" if number == timed else None)
        clock.mode = mode
        clock.times.clear()
        profile = start_profile(device) if mode == "profile" else None
        sync()
        start = time.perf_counter()
        loss = plain.step(number, clock)
        sync()
        spent = time.perf_counter() - start
        clock.mode = None
        if number == 0:
            side.first_loss = float(loss)
        if mode == "time":
            side.step_times.append(spent)
            side.phase_times.append(dict(clock.times))
        elif profile is not None:
            profile.__exit__(None, None, None)
            side.events = list(profile.events())
    return side


# ------------------------------------------------------------------------------------------
# the table
# ------------------------------------------------------------------------------------------
@dataclass
class PhaseRow:
    ms: float = 0.0
    top: int = 0
    copies: int = 0
    casts: int = 0
    bytes: int = 0
    launches: int = 0
    names: Counter[str] = field(default_factory=Counter)  # top-level operations by name


def phase_rows(side: Side) -> dict[str, PhaseRow]:
    """Per phase (and ``"step"``): median time, and the profiled step's counts."""
    by_phase = {(REST if k == OTHER else k): v for k, v in attribute(side.events).items()}
    times = [{(REST if k == OTHER else k): v for k, v in t.items()} for t in side.phase_times]
    names = {*by_phase, *(k for t in times for k in t)}
    rows = {}
    step = statistics.median(side.step_times)
    for name in names:
        events = by_phase.get(name, [])
        copies, casts, moved = copy_counts(events)
        count = count_events(events)
        rows[name] = PhaseRow(
            ms=1e3 * statistics.median(t.get(name, 0.0) for t in times),
            top=count.top_level,
            names=count.by_name,
            copies=copies,
            casts=casts,
            bytes=moved,
            launches=sum(1 for e in events if "LaunchKernel" in e.name),
        )
    rows.setdefault(REST, PhaseRow())
    rows[REST].ms = max(0.0, 1e3 * step - sum(r.ms for n, r in rows.items() if n != REST))
    total = PhaseRow(ms=1e3 * step)
    for row in rows.values():
        total.top += row.top
        total.copies += row.copies
        total.casts += row.casts
        total.bytes += row.bytes
        total.launches += row.launches
    rows["step"] = total
    return rows


def _order(name: str) -> tuple[int, str]:
    prefixes = ("views", "teacher ", "student forward", "head ", "grid matching", "normalizers")
    prefixes += ("losses", "backward", "optimizer", "guard", "data wait", REST, "step")
    for i, prefix in enumerate(prefixes):
        if name.startswith(prefix):
            return i, name
    return len(prefixes) - 3, name  # other named phases (e.g. C-RADIO's) before the rest


def table(lit: dict[str, PhaseRow], plain: dict[str, PhaseRow], cuda: bool) -> str:
    """Both sides per phase: ``lit`` / ``plain`` columns of each quantity."""
    header = ["phase", "ms lit", "ms plain", "x", "top lit", "top plain", "copy_ lit"]
    header += ["copy_ plain", "cast lit", "cast plain", "MB lit", "MB plain"]
    header += ["launch lit", "launch plain"] if cuda else []
    widths = [22] + [max(9, len(h)) for h in header[1:]]
    lines = [
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w)
            for i, (h, w) in enumerate(zip(header, widths, strict=True))
        )
    ]
    for name in sorted({*lit, *plain}, key=_order):
        a, b = lit.get(name, PhaseRow()), plain.get(name, PhaseRow())
        ratio = f"{a.ms / b.ms:.2f}" if b.ms > 0 else "-"
        cells = [name, f"{a.ms:.1f}", f"{b.ms:.1f}", ratio, a.top, b.top, a.copies, b.copies]
        cells += [a.casts, b.casts, f"{a.bytes / 1e6:.1f}", f"{b.bytes / 1e6:.1f}"]
        cells += [a.launches, b.launches] if cuda else []
        lines.append(
            "  ".join(
                str(c).ljust(w) if i == 0 else str(c).rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
        )
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------
# teachers at full size, counted on fake CUDA tensors
# ------------------------------------------------------------------------------------------
def meta_teachers(config: dict[str, Any]) -> dict[str, Any]:
    """The config's teachers at full size on the meta device (shapes only, nothing
    allocated; open_clip's final move to a device is skipped, it cannot move meta tensors)."""
    from unittest import mock

    import torch
    from lightning.pytorch.cli import instantiate_class

    teachers = {}
    skip_move = mock.patch(
        "open_clip.factory._set_model_device_and_precision", lambda *a, **k: None
    )
    for name, entry in ((config.get("model") or {}).get("teachers") or {}).items():
        with torch.device("meta"), skip_move:
            init = {**(entry.get("init_args") or {}), **harness.random_init(entry)}
            random = {"class_path": entry["class_path"], "init_args": init}
            teachers[name] = instantiate_class((), random)
    return teachers


def teachers_on_fake_cuda(args: argparse.Namespace) -> None:
    """Each teacher of ``args.config`` at full size on a batch of the config's size: radio-lit's
    ``Teacher.__call__`` under CUDA bf16 autocast (as ``bf16-mixed`` runs it) and the plain
    library call without autocast, counted by ``benchmarks/fake_cuda.py``."""
    from benchmarks.fake_cuda import FakeCuda
    from radio_lit.geometry.grid import student_input_size

    config = harness.load_config(args.config)
    model, data = config.get("model") or {}, (config.get("data") or {}).get("init_args") or {}
    batch = args.batch_size or data.get("batch_size", 32)
    side = student_input_size(model.get("student_resolution", 256), 16)
    patch = 16  # the student's grid: the stage configs' ViT-*/16 students
    grid = (side[0] // patch, side[1] // patch)
    mixed = str((config.get("trainer") or {}).get("precision", "32-true")) == "bf16-mixed"
    print(f"config {args.config}: teachers at full size, batch {batch}, fake CUDA tensors")
    print(f"radio-lit: Teacher(crop) under CUDA bf16 autocast: {mixed}; plain: library call")
    header = ["teacher", "ops lit", "ops plain", "casts lit", "casts plain", "copies lit"]
    header += ["copies plain", "MB lit", "MB plain"]
    widths = [22] + [max(9, len(h)) for h in header[1:]]
    print(
        "  ".join(
            h.ljust(w) if i == 0 else h.rjust(w)
            for i, (h, w) in enumerate(zip(header, widths, strict=True))
        )
    )
    for name, teacher in meta_teachers(config).items():
        size = tuple(teacher.view_size(grid))
        dtype = next(teacher.parameters()).dtype
        forward, _ = library_forward(teacher)
        with FakeCuda() as fake:
            state = fake.state(teacher)
            crop = fake.empty(batch, 3, *size)
            _, lit = fake.run(teacher, state, (crop, size), autocast=mixed, warm=True)
            view = fake.empty(batch, 3, *size, dtype=dtype)
            _, plain = fake.run(teacher, state, (view,), autocast=False, fn=forward)
        cells = [f"{name} {size[0]}px", lit.total, plain.total, lit.casts, plain.casts]
        cells += [lit.copies, plain.copies, f"{lit.moved / 1e6:.0f}", f"{plain.moved / 1e6:.0f}"]
        print(
            "  ".join(
                str(c).ljust(w) if i == 0 else str(c).rjust(w)
                for i, (c, w) in enumerate(zip(cells, widths, strict=True))
            )
        )
    print(
        "ops: aten operations dispatched below autograd and autocast (views included); casts: "
        "aten::_to_copy; copies: aten::clone and aten::copy_; MB read + written by both"
    )


def differences(lit: dict[str, PhaseRow], plain: dict[str, PhaseRow]) -> list[str]:
    """For each phase whose top-level operations differ by more than 10 % between the sides,
    the operations whose counts differ (``name radio-lit/plain``)."""
    lines = []
    for name in sorted({*lit, *plain} - {"step"}, key=_order):
        a, b = lit.get(name, PhaseRow()), plain.get(name, PhaseRow())
        if abs(a.top - b.top) <= 0.1 * max(b.top, 1):
            continue
        ops = sorted(
            (op for op in {*a.names, *b.names} if a.names[op] != b.names[op]),
            key=lambda op: -abs(a.names[op] - b.names[op]),
        )
        listed = ", ".join(
            f"{op.removeprefix('aten::')} {a.names[op]}/{b.names[op]}" for op in ops[:8]
        )
        more = f" (+{len(ops) - LISTED} more)" if len(ops) > LISTED else ""
        lines.append(f"  {name}: {listed}{more}")
    return lines


def main(argv: list[str] | None = None) -> None:
    args, user_overrides = parse_args(argv)
    harness.return_freed_memory()
    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.teachers_on_fake_cuda:
        harness.quiet()
        teachers_on_fake_cuda(args)
        return
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device available")
    harness.quiet()
    overrides, notes = device_overrides(harness.load_config(args.config), args)
    cli = harness.build(
        args.config,
        [*overrides, *user_overrides],
        # the profiled step, and one more: the last step logs (radio_lit.metrics.logging), so
        # the profiled one is a step like most of a run's
        max_steps=args.warmup + args.steps + 2,
        device=args.device,
        teacher_depth=args.teacher_depth,
    )
    harness.quiet()
    device = torch.device(args.device)
    module = cli.model
    batch = harness.first_batch(cli.datamodule)
    harness.fit_statistics(module, batch, device)
    precision = str(cli.trainer.precision)
    total = args.warmup + args.steps + 1
    plain = PlainStep(module, batch, device, precision, total)

    shape = tuple(batch.shape)
    print(f"config {args.config}; device {args.device}; precision {precision}; batch {shape}")
    for note in notes:
        print(f"note: {note}")
    if args.teacher_depth is not None:
        print(f"note: teachers shortened to {args.teacher_depth} blocks, widths kept")
    print("note: random weights (nothing loaded)")
    for name, api in plain.apis.items():
        print(f"plain teacher {name}: {api}")
    print(f"plain optimizer: fused torch.optim.AdamW (configured: {plain.configured})")

    lit = run_radio_lit(cli, args, batch, device)
    gc.collect()
    plain_side = run_plain(plain, args, device)
    cuda = device.type == "cuda"
    lit_rows, plain_rows = phase_rows(lit), phase_rows(plain_side)
    print()
    print(table(lit_rows, plain_rows, cuda))
    detail = differences(lit_rows, plain_rows)
    if detail:
        print("\ntop-level operations (radio-lit/plain) in phases more than 10 % apart:")
        print("\n".join(detail))
    print(
        f"\nmedian of {args.steps} timed steps after {args.warmup} warm-up; counts of one "
        "profiled step; copy_ includes nested copies (casts, contiguous, clone); MB read + "
        "written by copy_"
    )
    if device.type == "cpu":
        print(
            f"CPU times ({torch.get_num_threads()} threads) move with the machine's load; the "
            "counts do not"
        )
    difference = abs(lit.first_loss - plain_side.first_loss) / max(
        abs(plain_side.first_loss), 1e-12
    )
    print(
        f"first loss: radio-lit {lit.first_loss:.6g}, plain {plain_side.first_loss:.6g} "
        f"(relative difference {difference:.2e})"
    )
    step_lit = statistics.median(lit.step_times)
    step_plain = statistics.median(plain_side.step_times)
    images = batch.shape[0]
    print(
        f"images/s: radio-lit {images / step_lit:.2f}, plain {images / step_plain:.2f} "
        f"(batch {images})"
    )
    print(f"ratio (radio-lit / plain PyTorch): {step_lit / step_plain:.2f}")


if __name__ == "__main__":
    main()
