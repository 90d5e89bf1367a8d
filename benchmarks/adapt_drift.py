"""What adapting a RADIO keeps: its drift from the starting model, with and without the starting
model as a teacher of its own continuation.

The starting model is the quickstart's student, trained (``--start-steps``) and exported in
NVlabs' layout (``radio-lit export --format radio``), as the CPU twins of
``configs/recipes/{adapt,extend}`` start (``--start FILE``: an export already made). It is
continued on synthetic images (``radio_lit.data.SyntheticDataModule``: smooth gradients and
blobs, unlike the shipped photographs) with one new teacher, the extend twin's ``vit`` (a tiny
timm ViT, random weights written once per seed so that both variants learn the same one),
``--steps`` steps from ``model.init_from`` = the starting file:

- **(a) without** the starting model as a teacher: the new teacher alone (the extend twin with
  its ``RADIOTeacher`` entries removed);
- **(b) with** it: ``configs/recipes/extend/quickstart.yaml`` as shipped, the starting model
  (``RADIOTeacher``, ``loader: export``) the teacher of its backbone and of each head it ships.

Measured, on each of ``--seeds``:

- **drift** of the backbone's summary and patch features from the starting model's on the
  shipped photographs (the starting model's own images): each photograph's center crop at the
  crop size, resized to the student's resolution, and its four corner crops of that side (50
  views) [choice]; the normalized MSE ``sum ||x - x0||^2 / sum ||x0 - mean(x0)||^2`` over the
  set (0: no drift; 1: as far as the starting outputs are spread) and the mean cosine
  similarity of ``x`` and ``x0`` per vector;
- the new teacher's **fidelity** (PHI-S eq. 51, ``val/vit/fidelity``: higher is better) on
  held-out synthetic images (another seed of the same generator).

The last line: ``drift with itself as teacher / without: R (goal <= 0.5); new-teacher fidelity
ratio: F (goal >= 0.9)``, with ``R`` the normalized MSE of (b) over that of (a), summary and
features averaged over the seeds and then together (each counts alike) [choice], and ``F``
(b)'s mean fidelity over (a)'s.

    python benchmarks/adapt_drift.py                    # 4-6 min on the shared 2-core CPU
    python benchmarks/adapt_drift.py --start published/quickstart.pth   # the twins' file
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks import harness  # noqa: E402

EXTEND = ROOT / "configs" / "recipes" / "extend" / "quickstart.yaml"
#: The extend twin's new teacher (its other teachers are the starting model's outputs).
NEW_TEACHER = "vit"
#: Held-out images of the new domain: the training images' generator at another seed.
VALIDATION_SEED = 1000
VALIDATION_IMAGES = 32


@dataclass
class Drift:
    """How far one model's outputs are from the starting model's on the same images."""

    summary_nmse: float
    summary_cosine: float
    features_nmse: float
    features_cosine: float


@dataclass
class Row:
    seed: int
    variant: str  # "without" / "with"
    drift: Drift
    fidelity: float
    seconds: float


# ------------------------------------------------------------------------------------------
# the starting model
# ------------------------------------------------------------------------------------------
def run_cli(*args: str) -> None:
    """``radio-lit ARGS`` in a subprocess, as a user runs it; its output shown only on failure."""
    done = subprocess.run(
        [sys.executable, "-m", "radio_lit", *args], cwd=ROOT, capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"radio-lit {args[0]} failed (exit {done.returncode})")


def make_start(folder: Path, steps: int) -> Path:
    """The quickstart trained for ``steps`` steps and exported in NVlabs' layout, as the twins'
    headers make it (the evaluations left out: they measure nothing this benchmark reads)."""
    raw = harness.load_config(harness.QUICKSTART)
    callbacks = [
        c
        for c in raw["trainer"]["callbacks"]
        if not str(c.get("class_path", "")).startswith("radio_lit.evaluation")
    ]
    run_cli(
        "fit",
        "--config",
        str(harness.QUICKSTART),
        f"--trainer.max_steps={steps}",
        f"--trainer.default_root_dir={folder}",
        f"--trainer.logger.init_args.save_dir={folder}",
        "--trainer.logger.init_args.version=published",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        harness.override("--trainer.callbacks", callbacks),
    )
    name = raw["trainer"]["logger"]["init_args"]["name"]
    checkpoint = folder / name / "published" / "checkpoints" / "last.ckpt"
    output = folder / "published" / "quickstart"
    run_cli("export", str(checkpoint), "--format", "radio", "--output", str(output))
    return output.with_suffix(".pth")


# ------------------------------------------------------------------------------------------
# the adapted runs
# ------------------------------------------------------------------------------------------
def new_teacher_weights(folder: Path, seed: int) -> Path:
    """The new teacher's random weights for ``seed``, written once: (a) and (b) learn the same
    teacher (built as the extend twin builds it, ``checkpoint`` then loads them)."""
    import torch

    from radio_lit.teachers import TimmTeacher

    path = folder / f"{NEW_TEACHER}-seed{seed}.pth"
    if path.is_file():
        return path
    init = harness.load_config(EXTEND)["model"]["teachers"][NEW_TEACHER]["init_args"]
    torch.manual_seed(10_000 + seed)
    teacher = TimmTeacher(**{k: v for k, v in init.items() if k != "checkpoint"})
    torch.save(teacher.model.state_dict(), path)
    return path


def validation_folder(folder: Path, crop: int) -> Path:
    """Held-out images of the new domain as files (``val_dir`` takes a folder)."""
    from PIL import Image

    from radio_lit.data.synthetic import SyntheticImages

    out = folder / "synthetic-val"
    if out.is_dir():
        return out
    out.mkdir(parents=True)
    images = SyntheticImages(VALIDATION_IMAGES, crop, seed=VALIDATION_SEED)
    for i in range(len(images)):
        Image.fromarray(images[i].permute(1, 2, 0).numpy()).save(out / f"{i:03d}.png")
    return out


def without_itself(folder: Path) -> Path:
    """An overlay removing the extend twin's ``RADIOTeacher`` entries (variant a)."""
    teachers = harness.load_config(EXTEND)["model"]["teachers"]
    radio = [n for n, e in teachers.items() if e["class_path"].endswith("RADIOTeacher")]
    path = folder / "without-itself.yaml"
    path.write_text(json.dumps({"model": {"teachers": dict.fromkeys(radio)}}))
    return path


def adapt(start: Path, variant: str, seed: int, steps: int, folder: Path) -> tuple[Any, float]:
    """The extend twin (``variant`` ``with``) or its new teacher alone (``without``), from
    ``start``, trained ``steps`` steps at ``seed``: the module and the new teacher's fidelity
    on held-out synthetic images."""
    raw = harness.load_config(EXTEND)
    teachers = raw["model"]["teachers"]
    run = folder / f"{variant}-{seed}"
    run.mkdir(parents=True, exist_ok=True)
    overrides = [] if variant == "with" else ["--config", str(without_itself(folder))]
    crop = raw["data"]["init_args"]["crop_size"]
    weights = new_teacher_weights(folder, seed)
    overrides += [
        f"--seed_everything={seed}",
        f"--model.init_from={start}",
        f"--model.teachers.{NEW_TEACHER}.init_args.checkpoint={weights}",
        f"--data.init_args.val_dir={validation_folder(folder, crop)}",
        f"--data.init_args.seed={seed + 1}",
        f"--trainer.max_steps={steps}",
        f"--trainer.default_root_dir={run}",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.enable_progress_bar=false",
        "--trainer.enable_model_summary=false",
        "--trainer.num_sanity_val_steps=0",
        "--trainer.check_val_every_n_epoch=100000",  # validated once, after training
        harness.override("--trainer.callbacks", _training_callbacks(raw)),
    ]
    if variant == "with":
        radio = [n for n, e in teachers.items() if e["class_path"].endswith("RADIOTeacher")]
        overrides += [f"--model.teachers.{n}.init_args.model={start}" for n in radio]
    cli = harness.parse(EXTEND, *overrides)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    metrics = cli.trainer.validate(cli.model, datamodule=cli.datamodule, verbose=False)[0]
    return cli.model, float(metrics[f"val/{NEW_TEACHER}/fidelity"])


def _training_callbacks(raw: dict[str, Any]) -> list[dict[str, Any]]:
    from benchmarks.gpu_check import training_callbacks

    return training_callbacks(raw["trainer"]["callbacks"])


# ------------------------------------------------------------------------------------------
# drift
# ------------------------------------------------------------------------------------------
def photograph_views(crop: int, side: int) -> Any:
    """``[50, 3, side, side]`` in ``[0, 1]``: each shipped photograph's center crop at ``crop``
    px resized to ``side``, and its four ``side``-px corners."""
    import torch

    from radio_lit.data.image_folder import SAMPLE_IMAGES, ImageFolderDataset
    from radio_lit.data.transforms import eval_transform
    from radio_lit.data.views import as_float_images, resize_view

    photos = ImageFolderDataset(SAMPLE_IMAGES, eval_transform(crop))
    crops = as_float_images(torch.stack([photos[i] for i in range(len(photos))]))
    corners = [crops[..., :side, :side], crops[..., :side, -side:]]
    corners += [crops[..., -side:, :side], crops[..., -side:, -side:]]
    return torch.cat([resize_view(crops, side), *corners])


def drift(model: Any, start: Any, views: Any) -> Drift:
    """The backbone's summary and features of ``model`` against ``start``'s on ``views``."""
    import torch

    with torch.no_grad():
        ours, theirs = model(views)["backbone"], start(views)["backbone"]

    def nmse(x: Any, x0: Any) -> float:
        x, x0 = x.reshape(-1, x.shape[-1]).double(), x0.reshape(-1, x0.shape[-1]).double()
        return float((x - x0).pow(2).sum() / (x0 - x0.mean(0)).pow(2).sum())

    def cosine(x: Any, x0: Any) -> float:
        x, x0 = x.reshape(-1, x.shape[-1]), x0.reshape(-1, x0.shape[-1])
        return float(torch.nn.functional.cosine_similarity(x, x0, dim=-1).mean())

    return Drift(
        nmse(ours.summary, theirs.summary),
        cosine(ours.summary, theirs.summary),
        nmse(ours.features, theirs.features),
        cosine(ours.features, theirs.features),
    )


# ------------------------------------------------------------------------------------------
# the table
# ------------------------------------------------------------------------------------------
def ratios(rows: Sequence[Row]) -> tuple[float, float]:
    """``(R, F)`` of the module docstring."""

    def mean(variant: str, value: Any) -> float:
        return statistics.fmean(value(r) for r in rows if r.variant == variant)

    drifts = {
        v: mean(v, lambda r: r.drift.summary_nmse) + mean(v, lambda r: r.drift.features_nmse)
        for v in ("with", "without")
    }
    fidelity = mean("with", lambda r: r.fidelity) / mean("without", lambda r: r.fidelity)
    return drifts["with"] / drifts["without"], fidelity


def print_table(rows: Sequence[Row]) -> None:
    print(
        f"{'seed':>4}  {'itself as teacher':<17}  {'summary nMSE':>12}  {'cos':>6}  "
        f"{'features nMSE':>13}  {'cos':>6}  {'new fidelity':>12}  {'s':>5}"
    )
    for r in rows:
        d = r.drift
        print(
            f"{r.seed:>4}  {r.variant:<17}  {d.summary_nmse:>12.4f}  {d.summary_cosine:>6.3f}  "
            f"{d.features_nmse:>13.4f}  {d.features_cosine:>6.3f}  {r.fidelity:>12.3f}  "
            f"{r.seconds:>5.0f}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--start", default=None, help="an export to start from (default: make one)")
    parser.add_argument("--start-steps", type=int, default=300, help="the quickstart's steps")
    parser.add_argument("--steps", type=int, default=200, help="steps of each adapted run")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument("--workdir", default=None, help="where runs write (default: a new temp)")
    args = parser.parse_args(argv)

    import tempfile

    import torch

    import radio_lit

    harness.quiet()
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = Path(args.workdir or tempfile.mkdtemp(prefix="radio_lit_adapt_drift_"))
    folder.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    start = Path(args.start) if args.start else make_start(folder, args.start_steps)
    print(f"starting model: {start} ({time.perf_counter() - began:.0f} s)")
    start_model = radio_lit.load(start)
    raw = harness.load_config(EXTEND)
    views = photograph_views(
        raw["data"]["init_args"]["crop_size"], raw["model"]["student_resolution"]
    )
    rows = []
    for seed in args.seeds:
        for variant in ("without", "with"):
            t0 = time.perf_counter()
            module, fidelity = adapt(start, variant, seed, args.steps, folder)
            model = radio_lit.export.module_inference_model(module.eval())
            rows.append(Row(seed, variant, drift(model, start_model, views), fidelity, 0.0))
            rows[-1].seconds = time.perf_counter() - t0
    print(f"{args.steps} steps a run on synthetic images; drift on {len(views)} photograph views")
    print_table(rows)
    print(f"total {time.perf_counter() - began:.0f} s")
    r, f = ratios(rows)
    print(
        f"drift with itself as teacher / without: {r:.3f} (goal <= 0.5); "
        f"new-teacher fidelity ratio: {f:.3f} (goal >= 0.9)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
