"""Teacher-feature cache benchmark: a live step, a cached step and a student-only step.

One process, one config (default ``configs/quickstart.yaml``), read with radio-lit's own CLI
parser. The three sides train deep copies of the same module in a real
``lightning.pytorch.Trainer`` with normalizers fitted once beforehand (no statistics
estimation while timing):

* **live**: the config's own training loader (decode, random crop) and the teachers run in
  every step;
* **cached**: a float32 cache of the same training data written first (``radio-lit cache``'s
  own code, :func:`radio_lit.cache.writer.write_cache`, 1 view per item), read by
  ``radio_lit.cache.CachedViews``' loader (shard reads, safetensors decoding, collation);
* **student-only**: the same cached batches already in memory: the student, heads, losses and
  optimizer only, the floor a cache can reach.

Step time is the time between consecutive ``on_train_batch_start`` calls (every cost of the
loop included). The sides are interleaved (``--repeats`` rounds of one fit each), the first
``--warmup`` steps of every fit are dropped, and the medians are compared. Also printed: the
bytes per view per teacher and the cache's write rate.

    python benchmarks/cache.py                                  # quickstart, ~1 min on 2 CPUs
    python benchmarks/cache.py --config configs/ablations/base.yaml
"""

from __future__ import annotations

import argparse
import copy
import logging
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

_ROOT = Path(__file__).resolve().parents[1]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(_ROOT / "configs" / "quickstart.yaml"))
    parser.add_argument("--steps", type=int, default=20, help="timed steps per fit (20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per fit (3)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved fits per side (3)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args(argv)
    if args.steps < 2 or args.warmup < 1 or args.repeats < 1:
        parser.error("--steps must be >= 2, --warmup >= 1 and --repeats >= 1")
    return args


def _quiet() -> None:
    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", ""):
        logging.getLogger(name).setLevel(logging.ERROR)


def _build(config: str) -> Any:
    from radio_lit.cli.app import RadioLitCLI

    overrides = ["--trainer.logger=false", "--trainer.callbacks=[]", "--trainer.accelerator=cpu"]
    cli = RadioLitCLI(run=False, args=["--config", config, *overrides])
    _quiet()
    return cli


def _fit_normalizers(module: Any, batch: Any) -> None:
    """Fit every normalizer once on one batch's teacher features (no estimation while timed)."""
    import torch

    from radio_lit.data.views import as_float_images

    with torch.no_grad():
        for name, out in module.run_teachers(as_float_images(batch)).items():
            module.normalizers[name].update(out.features.float())
            module.normalizers[name].fit()
    module.estimate_statistics = module.refit_statistics = False


def _time_fit(template: Any, loader: Any, steps: int, warmup: int) -> list[float]:
    """Per-step seconds of one fit of a copy of ``template`` on ``loader``."""
    import lightning.pytorch as pl
    import torch

    times: list[float] = []

    class StepTimer(pl.Callback):
        mark: float | None = None

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, index: int) -> None:
            now = time.perf_counter()
            if self.mark is not None and index > warmup:
                times.append(now - self.mark)
            self.mark = now

        def on_train_end(self, trainer: Any, module: Any) -> None:
            times.append(time.perf_counter() - self.mark)

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=warmup + steps,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        callbacks=[StepTimer()],
    )
    torch.manual_seed(0)
    trainer.fit(copy.deepcopy(template), train_dataloaders=loader)
    return times


def _in_memory(batches: list[Any]) -> Any:
    """A DataLoader yielding batches already read (no collation, no reading)."""
    from torch.utils.data import DataLoader

    return DataLoader(batches, batch_size=None, shuffle=False, num_workers=0)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    from radio_lit.cache import CachedViews
    from radio_lit.cache.writer import write_cache

    _quiet()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cli = _build(args.config)
    module, datamodule = cli.model, cli.datamodule
    datamodule.setup("fit")
    live = datamodule.train_dataloader()
    _fit_normalizers(module, next(iter(live)))

    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        manifest = write_cache(module, datamodule, cli.config.as_dict(), Path(folder), views=1)
        seconds = time.perf_counter() - start
        written = sum(p.stat().st_size for p in Path(folder).glob("shard-*.tar"))
        cached_data = CachedViews(folder)
        cached_data.setup("fit")
        cached = cached_data.train_dataloader()
        batches = [b for _, b in zip(range(args.warmup + args.steps), cached, strict=False)]
        loaders = {"live": live, "cached": cached, "student-only": _in_memory(batches)}
        times: dict[str, list[float]] = {side: [] for side in loaders}
        for _ in range(args.repeats):
            for side, loader in loaders.items():
                times[side] += _time_fit(module, loader, args.steps, args.warmup)

    per_view = ", ".join(f"{k} {v} B" for k, v in manifest.bytes_per_view.items())
    print(
        f"config: {args.config}, batch {datamodule.batch_size}, {torch.get_num_threads()} threads"
    )
    print(f"bytes per view: {per_view}; {manifest.sample_bytes} B per view in a shard")
    print(
        f"cache write: {manifest.num_samples} views in {seconds:.1f} s = "
        f"{manifest.num_samples / seconds:.1f} views/s, {written / seconds / 2**20:.2f} MiB/s"
    )
    floor = statistics.median(times["student-only"])
    print("| step | median ms | / student-only |")
    print("| --- | ---: | ---: |")
    for side, values in times.items():
        median = statistics.median(values)
        print(f"| {side} | {1000 * median:.1f} | {median / floor:.2f} |")
    live_ratio = statistics.median(times["live"]) / statistics.median(times["cached"])
    print(f"live / cached: {live_ratio:.2f}")
    print(f"ratio (cached / student-only): {statistics.median(times['cached']) / floor:.2f}")


if __name__ == "__main__":
    main()
