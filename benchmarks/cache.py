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
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import harness  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(harness.QUICKSTART))
    parser.add_argument("--steps", type=int, default=20, help="timed steps per fit (20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps per fit (3)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved fits per side (3)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args(argv)
    if args.steps < 2 or args.warmup < 1 or args.repeats < 1:
        parser.error("--steps must be >= 2, --warmup >= 1 and --repeats >= 1")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    import torch

    from radio_lit.cache import CachedViews
    from radio_lit.cache.writer import write_cache

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    cli = harness.parse(args.config, *harness.BARE_TRAINER, "--trainer.accelerator=cpu")
    harness.quiet()
    module, datamodule = cli.model, cli.datamodule
    harness.fit_statistics(module, harness.first_batch(datamodule))
    live = datamodule.train_dataloader()

    with tempfile.TemporaryDirectory() as folder:
        start = time.perf_counter()
        manifest = write_cache(module, datamodule, cli.config.as_dict(), Path(folder), views=1)
        seconds = time.perf_counter() - start
        written = sum(p.stat().st_size for p in Path(folder).glob("shard-*.tar"))
        cached_data = CachedViews(folder)
        cached_data.setup("fit")
        cached = cached_data.train_dataloader()
        batches = [b for _, b in zip(range(args.warmup + args.steps), cached, strict=False)]
        loaders = {"live": live, "cached": cached, "student-only": harness.in_memory(batches)}
        times: dict[str, list[float]] = {side: [] for side in loaders}
        for _ in range(args.repeats):
            for side, loader in loaders.items():
                times[side] += harness.fit_times(module, loader, args.steps, args.warmup)

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
