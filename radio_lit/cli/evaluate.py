"""``radio-lit evaluate``: run the evaluation measures on a checkpoint and print a table.

    radio-lit evaluate --ckpt_path lightning_logs/quickstart/version_0/checkpoints/last.ckpt
    radio-lit evaluate --ckpt_path RUN/checkpoints/last.ckpt --config my_measures.yaml
    radio-lit evaluate --model_path RUN/export/last.safetensors
    radio-lit evaluate --model_path RUN/export/last.safetensors --run_config RUN/config.yaml
    radio-lit evaluate --model_path RUN/export/hf --config callbacks/segmentation.yaml

A training checkpoint is evaluated with the model described by its run's ``config.yaml``
(``--run_config``; by default the ``config.yaml`` two folders above the checkpoint, where
``radio-lit fit`` writes it). The measures are the evaluation callbacks that ``--config`` /
``--trainer.callbacks+`` arguments after the options give (callback presets, as for ``fit``:
``--config callbacks/evaluation.yaml``), else the run's own evaluation callbacks, else every
measure with its defaults (the segmentation probe, a training of its own, only when
asked). An exported model (``--model_path``, what ``radio-lit export`` writes, a Hugging Face
folder included) is loaded with ``radio_lit.load`` and evaluated at the resolution its own metadata
records (``preferred_resolution``, the student's training resolution, and ``patch_size`` in
``<stem>.json``); ``--run_config`` adds the run's teachers (for zero-shot, mode switching and
the teacher PCA panels) and its student resolution, ``--resolution`` overrides both.

Before it runs them, the command prints (on stderr) which measures it runs and where they come
from, and names each one it skips with the reason: a measure that compares the student with its
teachers (zero-shot, mode switching) cannot run on an exported model without the run's
teachers (``--run_config``).
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import yaml
from jsonargparse import ArgumentParser
from tqdm.auto import tqdm

from radio_lit.core.errors import ConfigError, checkpoint_file, device_option, with_suggestions
from radio_lit.core.yaml_files import read_mapping
from radio_lit.evaluation.base import Evaluation, Report, write_report
from radio_lit.evaluation.knn import KNNClassification
from radio_lit.evaluation.pca import PCAFeatureImages
from radio_lit.evaluation.rank import RankMe
from radio_lit.evaluation.resolution import ModeSwitching, ScaleEquivariance
from radio_lit.evaluation.token_merging import TokenMerging
from radio_lit.evaluation.view import ModelView, evaluation_mode, module_view
from radio_lit.evaluation.zero_shot import ZeroShotClassification
from radio_lit.export.checkpoint import read_training_checkpoint

#: Top-level keys of a run's config.yaml that describe the model, data and trainer (the
#: others, such as ``ckpt_path``, are arguments of the ``fit`` call).
_RUN_KEYS = ("seed_everything", "trainer", "model", "data", "optimizer", "lr_scheduler")


def parser() -> ArgumentParser:
    """The ``radio-lit evaluate`` options (the rest of the line chooses the measures)."""
    p = ArgumentParser(
        prog="radio-lit evaluate",
        description="Evaluate a checkpoint: kNN, zero-shot, PCA images, mode switching, "
        "scale equivariance, RankMe (linear-probe segmentation when a --config asks for it: "
        "callbacks/segmentation.yaml). Arguments after these options (--config FILE, "
        "--trainer.callbacks+ ...) choose the measures, as for radio-lit fit.",
        exit_on_error=False,
        allow_abbrev=False,
    )
    p.add_argument("--ckpt_path", type=str | None, default=None, help="training checkpoint")
    p.add_argument(
        "--model_path", type=str | None, default=None, help="exported model (radio_lit.load)"
    )
    p.add_argument(
        "--run_config",
        type=str | None,
        default=None,
        help="the run's config.yaml (default: <checkpoint>/../../config.yaml)",
    )
    p.add_argument(
        "--resolution", type=int | None, default=None, help="student side (exported model)"
    )
    p.add_argument("--device", type=str, default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument(
        "--log_dir", type=str | None, default=None, help="also write TensorBoard events here"
    )
    return p


def evaluate(argv: Sequence[str]) -> list[tuple[str, float]]:
    """Entry point of ``radio-lit evaluate``; returns the printed ``(tag, value)`` rows: the
    scalars, then each curve's points as ``<tag>@<x>px``."""
    args, rest = _split(list(argv))
    _check_measure_options(rest)
    options = parser().parse_args(args)
    if (options.ckpt_path is None) == (options.model_path is None):
        raise ConfigError("radio-lit evaluate: give exactly one of --ckpt_path or --model_path")
    device = device_option(options.device)
    run_config = options.run_config
    if options.ckpt_path is not None:
        checkpoint = checkpoint_file(options.ckpt_path, "--ckpt_path")
        run_config = run_config or str(checkpoint.resolve().parents[1] / "config.yaml")
    cli = _run_cli(run_config) if run_config is not None else None
    if options.ckpt_path is not None:
        view, step, module = _checkpoint_view(cli, options.ckpt_path, device)
    else:
        view, step, module = _exported_view(options, cli, device)
    measures, origin = _measures(cli, rest)
    measures = _runnable(measures, view, origin)
    report = Report()
    bar = tqdm(measures, unit="measure", desc="evaluate", dynamic_ncols=True)
    with evaluation_mode(module), torch.no_grad(), bar:
        for measure in bar:
            bar.set_postfix_str(type(measure).__name__)
            report.update(measure.evaluate(view))
    points = {f"{tag}@{x}px": y for tag, curve in report.curves.items() for x, y in curve.items()}
    rows = sorted(report.scalars.items()) + list(points.items())
    print(_table(rows, step))
    for tag, text in report.text.items():
        print(f"\n{tag}\n{text}")
    if report.images and options.log_dir is None:
        print(f"({len(report.images)} PCA images: give --log_dir to write them to TensorBoard)")
    if options.log_dir is not None:
        from lightning.pytorch.loggers import TensorBoardLogger

        write_report([TensorBoardLogger(options.log_dir, name="evaluate")], report, step)
    return rows


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """This command's own options, and the rest (for the run's LightningCLI)."""
    own = {f"--{a.dest}" for a in parser()._actions if a.dest != "help"}
    mine, rest, i = [], [], 0
    while i < len(argv):
        key = argv[i].split("=", 1)[0]
        target = mine if key in own or key in ("-h", "--help") else rest
        target.append(argv[i])
        takes_value = "=" not in argv[i] and key not in ("-h", "--help")
        if takes_value and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            target.append(argv[i + 1])
            i += 1
        i += 1
    return mine, rest


#: The options that choose the measures (:func:`_callbacks`), beside the command's own.
_MEASURE_OPTIONS = ("-c", "--config", "--trainer.callbacks", "--trainer.callbacks+")


def _check_measure_options(rest: list[str]) -> None:
    """Refuse, before the checkpoint is read, an option that is neither the command's own nor
    one that chooses the measures, with the closest known one suggested."""
    for arg in rest:
        key = arg.split("=", 1)[0]
        if key.startswith("-") and not key.startswith(_MEASURE_OPTIONS):
            known = [f"--{a.dest}" for a in parser()._actions if a.dest != "help"]
            message = with_suggestions(f"Unrecognized arguments: {key}", known + ["--config"])
            raise ConfigError(f"radio-lit evaluate: {message}")


def _run_cli(run_config: str) -> Any:
    """The run's model, trainer and callbacks, rebuilt from its config.yaml (not run)."""
    from radio_lit.cli.app import RadioLitCLI

    path = Path(run_config)
    if not path.is_file():
        raise ConfigError(
            f"--run_config: the run's config {path} does not exist; give --run_config "
            "(radio-lit fit writes config.yaml next to the run's checkpoints/ folder)"
        )
    config = {k: v for k, v in read_mapping(path, "--run_config").items() if k in _RUN_KEYS}
    if not isinstance(config.get("model"), dict):
        raise ConfigError(
            f"--run_config {path}: no model section; give the run's own config.yaml (radio-lit "
            "fit writes it next to the run's checkpoints/ folder)"
        )
    args = ["--config", yaml.safe_dump(config), "--trainer.logger", "false"]
    with warnings.catch_warnings():  # args= is given on purpose, beside `radio-lit evaluate`
        warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
        return RadioLitCLI(args=args, run=False)


def _measures(cli: Any, rest: list[str]) -> tuple[list[Evaluation], str]:
    """The measures, and where they come from: this command line's ``--config`` /
    ``--trainer.callbacks…`` arguments if any, else the run's evaluation callbacks, else the
    seven defaults (kNN, PCA images, scale equivariance, RankMe, token merging, zero-shot,
    mode switching; the segmentation probe trains a head of its own: only when asked)."""
    if rest:
        return [c for c in _callbacks(rest) if isinstance(c, Evaluation)], "the given --config"
    given = cli.trainer.callbacks if cli is not None else []
    measures = [c for c in given if isinstance(c, Evaluation)]
    if measures:
        return measures, "the run's evaluation callbacks"
    defaults: list[Evaluation] = [KNNClassification(), PCAFeatureImages(), ScaleEquivariance()]
    defaults += [RankMe(), TokenMerging(), ZeroShotClassification(), ModeSwitching()]
    return defaults, "the defaults"


def _runnable(measures: list[Evaluation], view: ModelView, origin: str) -> list[Evaluation]:
    """The measures that can run on ``view``, listed on stderr (the table of results goes to
    stdout) with where they come from; those that compare the student with teachers the view
    lacks are named as skipped, with the reason."""
    skipped = [m for m in measures if _missing_teachers(m, view)]
    runs = [m for m in measures if m not in skipped]
    print(f"radio-lit evaluate: measures ({origin}): {_names(runs) or 'none'}", file=sys.stderr)
    if skipped:
        missing = sorted({t for m in skipped for t in _missing_teachers(m, view)})
        reason = (
            f"the model has no teacher {', '.join(missing)}"
            if view.teachers
            else "an exported model carries no teachers: give --run_config RUN/config.yaml to "
            "build the run's"
        )
        print(
            f"radio-lit evaluate: skipped: {_names(skipped)}: they compare the student with "
            f"its teachers, and {reason}",
            file=sys.stderr,
        )
    return runs


def _missing_teachers(measure: Evaluation, view: ModelView) -> list[str]:
    """The teachers ``measure`` compares the student with that ``view`` lacks; mode switching
    without a list of teachers compares with all of the model's, so it needs one at least."""
    needed = list(measure.required_teachers())
    if isinstance(measure, ModeSwitching):
        needed += measure.teachers or []
        if not needed and not view.teachers:
            return ["any"]
    return [t for t in needed if t not in view.teachers]


def _names(measures: list[Evaluation]) -> str:
    return ", ".join(type(m).__name__ for m in measures)


def _callbacks(argv: list[str]) -> list[Any]:
    """``trainer.callbacks`` from callback presets (``callbacks+:`` lists append, as in fit)."""
    from jsonargparse import ActionConfigFile
    from lightning.pytorch.callbacks import Callback

    presets = ArgumentParser(prog="radio-lit evaluate", exit_on_error=False)
    presets.add_argument("-c", "--config", action=ActionConfigFile)
    presets.add_argument("--trainer.callbacks", type=list[Callback], default=[])
    try:
        parsed = presets.parse_args(argv)
    except Exception as err:  # jsonargparse's message names the bad key
        raise ConfigError(
            f"radio-lit evaluate: {err}; the arguments after the command's own options choose "
            "the measures: --config FILE (e.g. callbacks/evaluation.yaml) or "
            "--trainer.callbacks+ CLASS"
        ) from err
    return presets.instantiate_classes(parsed).trainer.callbacks


def _checkpoint_view(cli: Any, ckpt_path: str, device: torch.device) -> tuple[ModelView, int, Any]:
    module = cli.model
    state = read_training_checkpoint(ckpt_path)
    module.load_state_dict(state["state_dict"])
    module.to(device)
    return module_view(module), int(state.get("global_step", 0)), module


def _exported_view(options: Any, cli: Any, device: torch.device) -> tuple[ModelView, int, Any]:
    import radio_lit
    from radio_lit.export.files import model_file

    model = radio_lit.load(model_file(options.model_path, "--model_path")).to(device).eval()
    teachers = dict(cli.model.teachers.items()) if cli is not None else {}
    for teacher in teachers.values():
        teacher.to(device)
    if options.resolution is not None:
        size = (options.resolution, options.resolution)
    elif cli is not None:
        size = tuple(cli.model.student_resolution)
    else:
        size = exported_resolution(model.config["radio_lit"])
    return ModelView(model, size, model.patch_size, teachers), 0, model


def exported_resolution(extras: dict[str, Any]) -> tuple[int, int]:
    """``(H, W)`` an export was trained at: its metadata's ``preferred_resolution``."""
    height, width = (int(side) for side in extras["preferred_resolution"])
    return height, width


def _table(rows: list[tuple[str, float]], step: int) -> str:
    width = max([len(tag) for tag, _ in rows] + [len("measure")])
    lines = [f"{'measure':<{width}}  value   (step {step})", f"{'-' * width}  --------"]
    lines += [f"{tag:<{width}}  {value:.4g}" for tag, value in rows]
    return "\n".join(lines)
