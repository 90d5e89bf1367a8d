"""``radio-lit cache``: run a config's teachers once over its training data and store the views.

    radio-lit cache --config configs/quickstart.yaml --out cache/quickstart --views 8
    radio-lit fit --config configs/quickstart.yaml --data radio_lit.cache.CachedViews \\
        --data.path cache/quickstart

The run is built from its config as ``radio-lit fit`` builds it; the writer
(:func:`radio_lit.cache.writer.write_cache`) then stores every view. ``--views epochs`` writes
what the run will read and no more: its ``max_steps`` steps (the last view only up to the last
step's batch), not whole epochs (:func:`run_extent`).
"""

from __future__ import annotations

import os
import shlex
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from radio_lit.cache.grouping import train_steps
from radio_lit.cache.manifest import DTYPES
from radio_lit.cache.writer import write_cache
from radio_lit.cli.app import RadioLitCLI
from radio_lit.core.errors import CommandParser, device_option
from radio_lit.core.executable import executable

__all__ = ["fit_command", "main", "run_extent"]


def _parser() -> CommandParser:
    parser = CommandParser(
        prog="radio-lit cache",
        description="Run a config's teachers over its training data once and store the views "
        "(crops and teacher outputs) for radio-lit fit with data: radio_lit.cache.CachedViews. "
        "Any other --section.key value option is applied to the config, as for radio-lit fit.",
    )
    parser.add_argument("--config", action="append", required=True, help="the run's config(s)")
    parser.add_argument("--out", type=Path, required=True, help="the cache folder")
    parser.add_argument(
        "--views",
        default="8",
        help="views per image (default: 8), or 'epochs': what the run reads, so that a run "
        "from the cache sees what the live run would (its max_steps steps: whole epochs, "
        "then the last epoch's first steps)",
    )
    parser.add_argument(
        "--ranks",
        type=int,
        nargs="+",
        default=None,
        help="rank counts the cache replays exactly at (each rank count's teacher batches and "
        "mosaic canvases are stored; default: the config's trainer devices x num_nodes)",
    )
    parser.add_argument("--dtype", choices=list(DTYPES), default="float32")
    parser.add_argument("--samples-per-shard", type=int, default=None, help="default: ~256 MiB")
    parser.add_argument("--shard-index", type=int, default=int(os.environ.get("RANK", 0)))
    parser.add_argument("--num-shards", type=int, default=int(os.environ.get("WORLD_SIZE", 1)))
    parser.add_argument("--device", default=None, help="default: cuda:LOCAL_RANK if any, else cpu")
    return parser


def main(argv: Sequence[str]) -> None:
    """Entry point of ``radio-lit cache``."""
    parser = _parser()
    args, overrides = parser.parse_with_overrides(argv)
    if args.views != "epochs" and not (args.views.isdigit() and int(args.views) >= 1):
        parser.error(f"--views must be a positive integer or 'epochs', got {args.views!r}")
    if not 0 <= args.shard_index < args.num_shards:
        parser.error(
            f"--shard-index {args.shard_index} must lie in [0, --num-shards {args.num_shards})"
        )
    if args.samples_per_shard is not None and args.samples_per_shard < 1:
        parser.error(f"--samples-per-shard must be at least 1, got {args.samples_per_shard}")
    if args.device is not None:
        device_option(args.device)
    for config in args.config:
        if not Path(config).is_file():
            parser.error(f"--config {config}: no such config file")
    cli = _build_run([a for config in args.config for a in ("--config", config)] + overrides)
    ranks = args.ranks or [int(cli.trainer.world_size)]
    if min(ranks) < 1:
        parser.error(f"--ranks must be positive rank counts, got {args.ranks}")
    views, samples = run_extent(cli, ranks) if args.views == "epochs" else (int(args.views), None)
    write_cache(
        cli.model,
        cli.datamodule,
        cli.config.as_dict(),
        args.out,
        views=views,
        dtype=args.dtype,
        samples_per_shard=args.samples_per_shard,
        shard_index=args.shard_index,
        num_shards=args.num_shards,
        device=args.device,
        precision=str(cli.trainer.precision),
        command="radio-lit cache " + " ".join(argv),
        ranks=ranks,
        samples=samples,
    )
    others = " once every process has written its shards" if args.num_shards > 1 else ""
    print(f"radio-lit cache: {args.out} written; train from it{others} with:", flush=True)
    print(shlex.join(fit_command(args.config, overrides, args.out)), flush=True)


def fit_command(configs: Sequence[str], overrides: Sequence[str], out: Path) -> list[str]:
    """The ``radio-lit fit`` that trains from the cache ``out`` of the run ``configs`` +
    ``overrides``: the same configs and overrides but the ``--data…`` ones (the data is the
    cache's), and ``data: radio_lit.cache.CachedViews`` at ``out``."""
    kept: list[str] = []
    items = list(overrides)
    while items:
        option = items.pop(0)
        value = (
            [items.pop(0)] if "=" not in option and items and not items[0].startswith("--") else []
        )
        if not (option == "--data" or option.startswith(("--data.", "--data="))):
            kept += [option, *value]
    data = ["--data", "radio_lit.cache.CachedViews", "--data.path", str(out)]
    return [executable(), "fit", *(a for c in configs for a in ("--config", c)), *kept, *data]


def _build_run(args: list[str]) -> Any:
    """The run's model, data and trainer, built from its config (not run)."""
    with warnings.catch_warnings():  # args= is given on purpose, beside `radio-lit cache`
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        return RadioLitCLI(args=[*args, "--trainer.logger", "false"], run=False)


def run_extent(cli: Any, ranks: Sequence[int]) -> tuple[int, int | None]:
    """``(views, samples)`` a run of ``cli``'s config reads at any of the rank counts
    ``ranks``: with ``max_steps``, its steps' samples (the first ``samples`` of the cache's
    numbering, :mod:`radio_lit.cache.manifest`); else ``max_epochs`` whole views
    (``samples`` ``None``)."""
    trainer, datamodule = cli.trainer, cli.datamodule
    if trainer.max_steps is None or trainer.max_steps < 0:
        return max(1, int(trainer.max_epochs or 1)), None
    items = len(datamodule.build_train_dataset())
    batch, needed = datamodule.batch_size, 1
    for world in ranks:
        per_epoch = max(1, train_steps(items, world, batch))
        full, rest = divmod(trainer.max_steps, per_epoch)
        needed = max(needed, full * items + rest * batch * world)
    return -(-needed // items), needed
