"""LAMB's update, eager against compiled, beside the plain loop's fused AdamW, in one process.

The parameters are a config's trainable ones (default: stage 1's ViT-L/16 student, its four
teachers' heads; built by ``benchmarks/harness.py`` with random weights, teachers of one block:
their widths, hence the heads', kept), in ``radio_lit.training.optim``'s parameter groups, with
fixed random gradients of global norm above the config's ``max_grad_norm`` (LAMB clips them).
Three optimizers over the same parameters and gradients, each with its own state:

* ``LAMB eager``: ``timm.optim.Lamb`` as the config sets it (multi-tensor ``foreach`` step);
* ``LAMB compiled``: ``radio_lit.training.lamb.Lamb`` (the same settings) with ``compiled: true``:
  the closure-free update compiled by inductor (its first step compiles: reported apart);
* ``AdamW fused``: ``torch.optim.AdamW(fused=True)`` with the config's LR and weight decay, the
  plain loop's optimizer in ``benchmarks/train_step.py`` (the floor: one pass per tensor).

After ``--warmup`` untimed steps of each (state created, the compiled update compiled), the
three step in turn ``--steps`` times (interleaved: the machine's load hits them alike). Printed:
the median ms per step of each, its ratio to fused AdamW, the compiled against the eager LAMB,
and the one-off compilation (seconds, graphs)::

    python benchmarks/optimizer_step.py                                  # stage 1, CPU
    python benchmarks/optimizer_step.py --student-depth 6                # 6 of ViT-L's 24 blocks
    python benchmarks/optimizer_step.py --device cuda --steps 50         # on a GPU
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

STAGE1 = ROOT / "configs" / "stage1.yaml"


def parameter_groups(args: Any, overrides: list[str]) -> tuple[list[dict[str, Any]], dict]:
    """The config's trainable parameters in their optimizer groups on ``args.device``, each
    with a fixed gradient, and the config's LAMB settings (timm's defaults if it has none)."""
    import torch

    from benchmarks import harness
    from benchmarks.train_step import device_overrides
    from radio_lit.training.optim import parameter_groups as groups_of

    config = harness.load_config(args.config)
    one_device, _ = device_overrides(config, args)
    student = config["model"]["student"].get("init_args") or {}
    if args.student_depth is not None:
        kwargs = {**(student.get("model_kwargs") or {}), "depth": args.student_depth}
        overrides = [*overrides, harness.override("--model.student.init_args.model_kwargs", kwargs)]
    cli = harness.build(
        args.config, [*one_device, *overrides], max_steps=1, device=args.device, teacher_depth=1
    )
    module = cli.model.to(args.device)
    generator = torch.Generator().manual_seed(0)
    groups = groups_of(module.trainable_parameters())
    for group in groups:
        for param in group["params"]:
            param.grad = torch.randn(param.shape, generator=generator).to(param.device)
    optimizer = config["model"].get("optimizer") or {}
    lamb = optimizer.get("init_args") or {} if "Lamb" in optimizer.get("class_path", "") else {}
    return groups, lamb


def main(argv: list[str] | None = None) -> None:
    from benchmarks import harness

    parser = harness.step_arguments(__doc__, "timed steps of each optimizer (default 10)")
    parser.set_defaults(config=str(STAGE1), steps=10, warmup=1)
    parser.add_argument(
        "--student-depth", type=int, default=None, help="the student's blocks (widths kept)"
    )
    args, overrides = parser.parse_known_args(argv)
    args.batch_size = None  # device_overrides': the config's data is not used
    import timm.optim
    import torch

    from radio_lit.training.lamb import Lamb

    harness.quiet()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    groups, lamb = parameter_groups(args, overrides)
    params = [p for group in groups for p in group["params"]]
    synchronize = harness.synchronizer(params[0].device)
    settings = {k: v for k, v in lamb.items() if k != "foreach"}
    adamw = {k: v for k, v in lamb.items() if k in ("lr", "weight_decay", "betas", "eps")}
    optimizers = {
        "LAMB eager": timm.optim.Lamb(groups, **settings, foreach=True),
        "LAMB compiled": Lamb(groups, **settings, compiled=True),
        "AdamW fused": torch.optim.AdamW(groups, **adamw, fused=True),
    }
    first: dict[str, float] = {}
    for name, optimizer in optimizers.items():
        start = time.perf_counter()
        for _ in range(args.warmup):
            optimizer.step()
        synchronize()
        first[name] = time.perf_counter() - start
    times: dict[str, list[float]] = {name: [] for name in optimizers}
    for _ in range(args.steps):
        for name, optimizer in optimizers.items():
            synchronize()
            start = time.perf_counter()
            optimizer.step()
            synchronize()
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values) for name, values in times.items()}
    tensors, elements = len(params), sum(p.numel() for p in params)
    print(f"config: {args.config} ({args.device}, {torch.get_num_threads()} threads)")
    print(f"parameters: {tensors} tensors, {elements / 1e6:.1f} M elements, {len(groups)} groups")
    print(f"{'optimizer':<16}{'ms/step':>10}{'x AdamW':>10}")
    for name, seconds in median.items():
        print(f"{name:<16}{seconds * 1e3:>10.1f}{seconds / median['AdamW fused']:>10.2f}")
    stats = optimizers["LAMB compiled"].stats
    compile_s = first["LAMB compiled"] - args.warmup * median["LAMB compiled"]
    print(f"compilation: {compile_s:.1f} s once ({stats.graphs} graph(s), {stats.frames} frame(s))")
    ratio = median["LAMB compiled"] / median["LAMB eager"]
    print(f"ratio (LAMB compiled / LAMB eager): {ratio:.2f}")


if __name__ == "__main__":
    main()
