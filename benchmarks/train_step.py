"""Training-step benchmark: radio-lit's DistillationModule in a Lightning Trainer vs plain PyTorch.

Both sides train the same models (deep copies of one initial state built from
``configs/quickstart.yaml``: tiny CLIP-, DINOv2- and SAM-architecture teachers, a CPE ViT student,
PHI-S normalizers fitted once on the batch, AdamW with warm-up + cosine schedule) on the same
pre-built uint8 batch, in one process, and must produce the same loss at every step:

* radio-lit: ``lightning.pytorch.Trainer(...).fit(module, loader)``; per-step wall time is taken
  from inside the loop by a callback (the time between consecutive ``on_train_batch_start``
  calls, so every cost of the loop is in it: data fetch, hooks, step, backward, optimizer,
  scheduler, logging).
* plain PyTorch: a hand-written loop doing the same math (views, frozen teachers under
  ``torch.no_grad``, normalizers, student, heads, antialiased bilinear resize, MSE + cosine,
  backward, ``optimizer.step``, ``zero_grad``, scheduler step), timed at the same point of its loop.

The two sides are interleaved step by step ("lockstep", the default): the callback's
``on_train_batch_start`` hook also runs one step of the plain loop (on its own RNG stream, timed
on its own and left out of the Trainer's interval), so every Trainer step is paired with a
plain step taken under the same machine load. Each of ``--repeats`` fits starts from fresh
copies; the first ``--warmup`` steps of each are discarded. ``--mode separate`` times whole
runs of each side instead, alternating their order. Peak memory is measured per side in a
fresh subprocess. The last line printed is ``ratio (radio-lit / plain PyTorch): X.XX``, the
median over paired steps of the radio-lit step time divided by the plain step time.

    python benchmarks/train_step.py            # quickstart model, batch 8; ~1.5 min on 2 CPUs
    python benchmarks/train_step.py --help
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import logging
import math
import os
import statistics
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_QUICKSTART = "quickstart.yaml"


# --------------------------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------------------------
def default_config() -> str:
    """``configs/quickstart.yaml`` of the source tree, else the copy packaged in radio_lit."""
    repo = Path(__file__).resolve().parents[1] / "configs" / _QUICKSTART
    if repo.is_file():
        return str(repo)
    from importlib import resources

    packaged = Path(str(resources.files("radio_lit") / "configs" / _QUICKSTART))
    return str(packaged)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=40, help="timed steps per run (default 40)")
    parser.add_argument(
        "--warmup", type=int, default=5, help="untimed steps at the start of every run (5)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=None, help="images per batch (default: the config's, 8)"
    )
    parser.add_argument(
        "--student-resolution",
        type=int,
        default=None,
        help="student input side in pixels (default: the config's, 64)",
    )
    parser.add_argument(
        "--repeats", type=int, default=4, help="interleaved runs per side (default 4)"
    )
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument(
        "--config",
        default=None,
        help="radio-lit config with model and data sections (default: configs/quickstart.yaml)",
    )
    parser.add_argument(
        "--mode",
        choices=("lockstep", "separate"),
        default="lockstep",
        help="lockstep (default): one plain step inside every Trainer step, paired in time; "
        "separate: whole runs of each side, alternating",
    )
    parser.add_argument(
        "--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)"
    )
    parser.add_argument(
        "--no-memory", action="store_true", help="skip the two peak-memory subprocesses"
    )
    parser.add_argument(
        "--no-module-logging",
        action="store_true",
        help="diagnostic: make the module's self.log / self.log_dict no-ops on the radio-lit "
        "side, to measure what logging costs",
    )
    parser.add_argument(
        "--profile",
        choices=("radio-lit", "plain"),
        default=None,
        help="instead of benchmarking, run one side under cProfile and print the top entries",
    )
    parser.add_argument("--memory-side", choices=("radio-lit", "plain"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.steps < 2 or args.warmup < 1 or args.repeats < 1:
        parser.error("--steps must be >= 2, --warmup >= 1 and --repeats >= 1")
    args.config = args.config or default_config()
    if not Path(args.config).is_file():
        parser.error(f"config {args.config} not found; pass --config PATH")
    return args


def quiet() -> None:
    """Keep the output to the benchmark's own lines."""
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", ""):
        logging.getLogger(name).setLevel(logging.ERROR)


# --------------------------------------------------------------------------------------------
# the setup shared by both sides
# --------------------------------------------------------------------------------------------
@dataclass
class Setup:
    template: Any  # DistillationModule with fitted normalizers, never trained
    batch: Any  # [B, 3, S, S] uint8 on the CPU, as a DataLoader yields it
    device: Any
    log_every_n_steps: int = 50
    seed: int = 1234
    module_logging: bool = True


def build(args: argparse.Namespace) -> Setup:
    """Instantiate model and data from the config with radio-lit's own CLI parser.

    Of the config's trainer section only ``log_every_n_steps`` is kept (logger, callbacks and
    the rest are not used): each side builds its own loop. Normalizers are fitted once on the
    batch, so both sides map targets with the same transform and no statistics are estimated
    while timing.
    """
    import torch

    from radio_lit.cli import RadioLitCLI
    from radio_lit.data.views import as_float_images

    quiet()  # after lightning's import, which sets its loggers to INFO
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    overrides = [
        "--trainer.logger=false",
        "--trainer.callbacks=[]",
        "--trainer.enable_model_summary=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.accelerator=cpu",
    ]
    if args.batch_size is not None:
        overrides.append(f"--data.init_args.batch_size={args.batch_size}")
    if args.student_resolution is not None:
        overrides.append(f"--model.student_resolution={args.student_resolution}")
    cli = RadioLitCLI(run=False, args=["--config", args.config, *overrides])
    module, datamodule = cli.model, cli.datamodule
    datamodule.setup("fit")
    batch = next(iter(datamodule.train_dataloader()))  # shipped photographs, random crops

    device = torch.device(args.device)
    module.to(device)
    with torch.no_grad():
        crop = as_float_images(batch.to(device))
        for name, out in module.run_teachers(crop).items():
            normalizer = module.normalizers[name]
            normalizer.update(out.features.float())
            normalizer.fit()
    module.estimate_statistics = module.refit_statistics = False
    return Setup(
        template=module,
        batch=batch,
        device=device,
        log_every_n_steps=cli.trainer.log_every_n_steps,  # the config's (quickstart: 5)
        module_logging=not args.no_module_logging,
    )


def make_loader(batch: Any, length: int) -> Any:
    """A DataLoader yielding the same pre-built batch ``length`` times (no collation)."""
    from torch.utils.data import DataLoader, Dataset

    class SameBatch(Dataset):
        def __len__(self) -> int:
            return length

        def __getitem__(self, index: int) -> Any:
            return batch

    return DataLoader(SameBatch(), batch_size=None, shuffle=False, num_workers=0)


def synchronizer(device: Any) -> Callable[[], None]:
    import torch

    if device.type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


# --------------------------------------------------------------------------------------------
# plain side: the same math written directly in PyTorch
# --------------------------------------------------------------------------------------------
def lr_multiplier(step: int, warmup: int, total: int, min_ratio: float) -> float:
    """Linear warm-up to 1, then cosine annealing to ``min_ratio`` (the module's schedule)."""
    if step < warmup:
        return (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


class PlainLoop:
    """A hand-written training loop over ``total`` steps; :meth:`step` runs one iteration.

    Deep copies of the template's student, heads, teachers and fitted normalizers, used as plain
    ``nn.Module`` objects; AdamW (the config's optimizer) over the same decay / no-decay groups;
    the same LR schedule as ``LambdaLR``; the same DataLoader as the Trainer gets.
    """

    def __init__(self, setup: Setup, total: int) -> None:
        from torch.optim.lr_scheduler import LambdaLR

        from radio_lit.losses import MSE, Cosine
        from radio_lit.optim import weight_decayed

        tpl = setup.template
        if type(tpl.feature_loss) is not MSE or type(tpl.summary_loss) is not Cosine:
            raise SystemExit("the plain loop implements MSE feature and cosine summary losses")
        self.device = setup.device
        self.student = copy.deepcopy(tpl.student).train()
        self.heads = copy.deepcopy(tpl.heads).train()
        self.teachers = copy.deepcopy(tpl.teachers).eval()
        self.normalizers = copy.deepcopy(tpl.normalizers)
        self.resolution = tpl.student_resolution
        self.student_stats = (tpl.student_mean, tpl.student_std)
        self.teacher_stats = {n: (t.mean, t.std) for n, t in self.teachers.items()}
        self.token = tpl.summary_token
        self.feature_weights, self.summary_weights = tpl.feature_weights, tpl.summary_weights

        decay, no_decay = [], []
        named = [*self.student.named_parameters(), *self.heads.named_parameters()]
        for name, p in named:
            (decay if weight_decayed(name, p) else no_decay).append(p)
        self.optimizer = tpl.optimizer_factory(
            [{"params": decay}, {"params": no_decay, "weight_decay": 0.0}]
        )
        warmup, min_ratio = tpl.warmup_steps, tpl.min_lr_ratio
        self.scheduler = LambdaLR(
            self.optimizer, lambda s: lr_multiplier(s, warmup, total, min_ratio)
        )
        self.batches = iter(make_loader(setup.batch, total))

    @staticmethod
    def view(crop: Any, size: tuple[int, int], mean: Any, std: Any) -> Any:
        """radio-lit's resize (kornia, antialiased bilinear) and per-channel normalization."""
        from radio_lit.data.views import normalize_view, resize_view

        return normalize_view(resize_view(crop, size), mean, std)

    def step(self) -> Any:
        """One iteration: fetch, forward, loss, backward, optimizer and scheduler steps."""
        import torch
        import torch.nn.functional as F

        from radio_lit.students.spectral_reparam import spectral_step

        batch = next(self.batches)
        crop = batch.to(self.device, non_blocking=True).float().div_(255.0)
        with torch.no_grad():
            outputs = {
                n: t.encode(self.view(crop, (t.resolution,) * 2, *self.teacher_stats[n]))
                for n, t in self.teachers.items()
            }
            targets = {n: self.normalizers[n](o.features.float()) for n, o in outputs.items()}
        with spectral_step(self.student):  # σReparam: once per step, as the training step
            student = self.student(self.view(crop, self.resolution, *self.student_stats))
        loss = 0.0
        for n, out in outputs.items():
            heads, target = self.heads[n], targets[n]
            pred = heads.features(student.features)
            if pred.shape[1:3] != target.shape[1:3]:
                pred = F.interpolate(
                    pred.permute(0, 3, 1, 2),
                    size=target.shape[1:3],
                    mode="bilinear",
                    align_corners=False,
                    antialias=True,  # as radio_lit.grid.resample
                ).permute(0, 2, 3, 1)
            loss = loss + self.feature_weights[n] * F.mse_loss(pred, target)
            if heads.summary is not None and out.summary is not None:
                summary = heads.summary(student.summary[:, self.token[n]])
                cos = F.cosine_similarity(summary, out.summary.float(), dim=-1)
                loss = loss + self.summary_weights[n] * (1.0 - cos).mean()
        loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return loss.detach()


# --------------------------------------------------------------------------------------------
# radio-lit side: a real Lightning Trainer
# --------------------------------------------------------------------------------------------
class _RNG:
    """Save / restore the global RNG (CPU and, on CUDA, the device's) for two interleaved runs."""

    def __init__(self, device: Any) -> None:
        self.cuda = device.type == "cuda"

    def get(self) -> Any:
        import torch

        return (torch.get_rng_state(), torch.cuda.get_rng_state() if self.cuda else None)

    def set(self, state: Any) -> None:
        import torch

        torch.set_rng_state(state[0])
        if self.cuda:
            torch.cuda.set_rng_state(state[1])


def fit(setup: Setup, total: int, plain: PlainLoop | None = None) -> dict[str, list[float]]:
    """``Trainer.fit`` of a fresh copy of the module for ``total + 1`` steps.

    Per-step time of the Trainer: between consecutive ``on_train_batch_start`` calls (the
    extra last step only closes the last interval). With ``plain``, the same hook also runs
    one step of the plain loop (lockstep), on its own RNG stream; its duration is measured on
    its own and taken out of the Trainer's interval.
    """
    import lightning.pytorch as pl
    import torch

    sync, rng = synchronizer(setup.device), _RNG(setup.device)
    result: dict[str, list[Any]] = {"radio-lit": [], "plain": [], "loss": [], "plain_loss": []}

    class StepTimer(pl.Callback):
        mark: float | None = None
        plain_rng: Any = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
            sync()
            now = time.perf_counter()
            if self.mark is not None:
                result["radio-lit"].append(now - self.mark)
            if batch_idx == 0:
                torch.manual_seed(setup.seed)  # same CPE windows on both sides
                self.plain_rng = rng.get()
            if plain is not None and batch_idx < total:
                lit_rng = rng.get()
                rng.set(self.plain_rng)
                start = time.perf_counter()
                loss = plain.step()
                sync()
                result["plain"].append(time.perf_counter() - start)
                result["plain_loss"].append(loss)
                self.plain_rng = rng.get()
                rng.set(lit_rng)
            self.mark = time.perf_counter()

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
            result["loss"].append(outputs["loss"].detach())

    module = copy.deepcopy(setup.template)
    if not setup.module_logging:
        module.log = module.log_dict = lambda *args, **kwargs: None
    trainer = pl.Trainer(
        accelerator=setup.device.type,
        devices=1,
        max_steps=total + 1,
        log_every_n_steps=setup.log_every_n_steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        callbacks=[StepTimer()],
    )
    trainer.fit(module, train_dataloaders=make_loader(setup.batch, total + 1))
    for key in ("loss", "plain_loss"):
        result[key] = [float(v) for v in result[key][:total]]
    return result


def run_radio_lit(setup: Setup, total: int) -> dict[str, list[float]]:
    """The Trainer alone (memory measurement, profiling, ``--mode separate``)."""
    return fit(setup, total)


def run_plain(setup: Setup, total: int) -> dict[str, list[float]]:
    """The plain loop alone, for ``total + 1`` steps like the Trainer (same LR schedule)."""
    import torch

    loop, sync = PlainLoop(setup, total + 1), synchronizer(setup.device)
    times, losses = [], []
    for step in range(total + 1):
        if step == 0:
            torch.manual_seed(setup.seed)
        sync()
        start = time.perf_counter()
        losses.append(loop.step())
        sync()
        times.append(time.perf_counter() - start)
    return {"plain": times[:total], "loss": [float(v) for v in losses[:total]]}


SIDES = {"radio-lit": run_radio_lit, "plain": run_plain}


# --------------------------------------------------------------------------------------------
# peak memory: one fresh process per side
# --------------------------------------------------------------------------------------------
def _proc_status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def measure_memory(args: argparse.Namespace) -> None:
    """Child process: build, then report the peak memory growth of one run of one side.

    The peak resident set size (VmHWM) is reset through ``/proc/self/clear_refs`` once the
    models, the batch and the fitted normalizers exist; the result is the VmHWM after the run
    minus the VmRSS before it. The parent sets ``MALLOC_MMAP_THRESHOLD_`` so that glibc
    returns freed tensor memory to the OS at once (RSS then follows live memory instead of
    glibc's adaptive caching). On CUDA, ``torch.cuda.max_memory_allocated`` growth as well.
    """
    import torch

    setup = build(args)
    total = args.warmup + args.steps
    cuda = setup.device.type == "cuda"
    result: dict[str, Any] = {"side": args.memory_side}
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        cuda_base = torch.cuda.memory_allocated()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset VmHWM to the current RSS (Linux >= 4.0)
    base_kib = _proc_status_kib("VmRSS")
    SIDES[args.memory_side](setup, total)
    result["rss_peak_mib"] = (_proc_status_kib("VmHWM") - base_kib) / 1024
    if cuda:
        torch.cuda.synchronize()
        result["cuda_peak_mib"] = (torch.cuda.max_memory_allocated() - cuda_base) / 2**20
    print(json.dumps(result))


def memory_in_subprocesses(args: argparse.Namespace) -> dict[str, dict[str, float] | None]:
    """Run :func:`measure_memory` for both sides in fresh processes (concurrently)."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    children = {}
    for side in SIDES:
        argv = [sys.executable, str(Path(__file__).resolve()), "--memory-side", side]
        for flag in (
            "steps",
            "warmup",
            "batch_size",
            "student_resolution",
            "device",
            "config",
            "threads",
        ):
            value = getattr(args, flag)
            if value is not None:
                argv += [f"--{flag.replace('_', '-')}", str(value)]
        children[side] = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )
    results: dict[str, dict[str, float] | None] = {}
    for side, child in children.items():
        out, err = child.communicate()
        if child.returncode != 0:
            print(f"  memory subprocess ({side}) failed:\n{err[-2000:]}", file=sys.stderr)
            results[side] = None
        else:
            results[side] = json.loads(out.strip().splitlines()[-1])
    return results


# --------------------------------------------------------------------------------------------
# profiling helper (investigations; not part of the benchmark numbers)
# --------------------------------------------------------------------------------------------
def profile(args: argparse.Namespace, setup: Setup) -> None:
    import cProfile
    import pstats

    total = args.warmup + args.steps
    SIDES[args.profile](setup, args.warmup)  # warm caches outside the profile
    prof = cProfile.Profile()
    prof.enable()
    SIDES[args.profile](setup, total)
    prof.disable()
    stats = pstats.Stats(prof).strip_dirs().sort_stats("cumulative")
    stats.print_stats(45)
    stats.sort_stats("tottime").print_stats(25)


# --------------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------------
def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    quiet()
    if args.memory_side:
        measure_memory(args)
        return

    import lightning
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device available")
    setup = build(args)
    if args.profile:
        profile(args, setup)
        return

    tpl = setup.template
    batch_size = setup.batch.shape[0]
    print(
        f"config {args.config}\n"
        f"torch {torch.__version__}, lightning {lightning.__version__}, device {args.device}, "
        f"{torch.get_num_threads()} threads\n"
        f"batch {tuple(setup.batch.shape)} uint8, student {tpl.student_resolution[0]} px "
        f"({sum(p.numel() for p in tpl.student.parameters()) / 1e6:.2f} M params), teachers "
        + ", ".join(f"{n} {t.resolution} px" for n, t in tpl.teachers.items())
        + f"\n{args.repeats} repeats x {args.steps} timed steps (+{args.warmup} warm-up) "
        f"per side, {args.mode}"
        + ("; radio-lit module logging OFF (diagnostic)" if args.no_module_logging else "")
    )

    total = args.warmup + args.steps
    times: dict[str, list[float]] = {side: [] for side in SIDES}
    overheads: list[float] = []  # radio-lit minus plain: per step (lockstep) or per repeat
    ratios: list[float] = []  # radio-lit over plain: per step (lockstep) or per repeat
    max_loss_diff, first_loss = 0.0, float("nan")
    load_before = os.getloadavg()[0]
    for repeat in range(args.repeats):
        gc.collect()  # the previous repeat's Trainer and copies (reference cycles), untimed
        if args.mode == "lockstep":
            run = fit(setup, total, PlainLoop(setup, total + 1))
            runs = {"radio-lit": run, "plain": run}
            lit_loss, plain_loss = run["loss"], run["plain_loss"]
        else:  # separate runs, alternating which side goes first
            order = list(SIDES) if repeat % 2 == 0 else list(SIDES)[::-1]
            runs = {side: SIDES[side](setup, total) for side in order}
            lit_loss, plain_loss = runs["radio-lit"]["loss"], runs["plain"]["loss"]
        timed = {side: runs[side][side][args.warmup : total] for side in SIDES}
        medians = {side: statistics.median(timed[side]) for side in SIDES}
        for side in SIDES:
            times[side] += timed[side]
        if args.mode == "lockstep":
            pairs = list(zip(timed["radio-lit"], timed["plain"], strict=True))
            overheads += [a - b for a, b in pairs]
            ratios += [a / b for a, b in pairs]
            repeat_ratio = statistics.median(a / b for a, b in pairs)
        else:
            overheads.append(medians["radio-lit"] - medians["plain"])
            ratios.append(medians["radio-lit"] / medians["plain"])
            repeat_ratio = ratios[-1]
        max_loss_diff = max(
            max_loss_diff, *(abs(a - b) for a, b in zip(lit_loss, plain_loss, strict=True))
        )
        first_loss = plain_loss[0]
        print(
            f"  repeat {repeat + 1}: radio-lit {medians['radio-lit'] * 1e3:7.2f} ms, "
            f"plain {medians['plain'] * 1e3:7.2f} ms, "
            f"ratio {repeat_ratio:.3f}"
        )
    load_after = os.getloadavg()[0]
    print(
        f"same math: max |loss(radio-lit) - loss(plain)| over all steps = {max_loss_diff:.3g} "
        f"(first loss {first_loss:.4f})"
    )
    print(
        f"load average (1 min) {load_before:.2f} before, {load_after:.2f} after timing "
        f"on {os.cpu_count()} CPUs"
    )

    memory = {} if args.no_memory else memory_in_subprocesses(args)

    print(f"{'':<14}{'median step':>14}{'images/s':>11}{'peak memory growth':>24}")
    for side, label in (("radio-lit", "radio-lit"), ("plain", "plain PyTorch")):
        median = statistics.median(times[side])
        mem = memory.get(side)
        if mem is None:
            mem_text = "n/a"
        elif "cuda_peak_mib" in mem:
            mem_text = f"{mem['cuda_peak_mib']:.1f} MiB CUDA"
        else:
            mem_text = f"+{mem['rss_peak_mib']:.1f} MiB RSS"
        print(f"{label:<14}{median * 1e3:>11.2f} ms{batch_size / median:>11.1f}{mem_text:>24}")
    unit = "paired steps" if args.mode == "lockstep" else "repeats"
    print(
        f"overhead per step: {statistics.median(overheads) * 1e3:.2f} ms "
        f"(median of radio-lit - plain over {len(overheads)} {unit})"
    )
    print(f"ratio (radio-lit / plain PyTorch): {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
