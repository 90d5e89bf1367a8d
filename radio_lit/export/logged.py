"""What a run logged about the weights of one of its checkpoints: the ``val/`` and ``eval/``
scalars of its TensorBoard events, named for a reader, with the chance level of the
classification accuracies and the data each measure ran on (for a model card).

Steps. A checkpoint saved at optimizer step ``S`` (``global_step``) holds the weights after
``S`` steps. The evaluation callbacks log at ``trainer.global_step``, after the step's
``on_train_batch_end`` (:mod:`radio_lit.evaluation.base`): an ``eval/`` point at step ``s``
measured the weights of step ``s``. Lightning logs a validation epoch at the count of batches
that stepped *before* the current one (``_batches_that_stepped`` grows after validation, in
``on_advance_end``): a ``val/`` point at step ``s`` measured the weights of step ``s + 1``
(the quickstart's validation after 300 steps is logged at 299).
"""

from __future__ import annotations

import importlib
import inspect
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radio_lit.data.image_folder import list_images, sample_images_dir

_METRIC_PREFIXES = ("val/", "eval/")
#: Curves' points (``<tag>/step_<training step>``, x = student resolution) are no final metric.
_CURVE_POINT = re.compile(r"/step_\d+$")
#: The labeled set of the shipped photographs (``radio_lit.evaluation.data.SAMPLE_CLASSES``;
#: export does not import the evaluation layer): one class per photograph.
SAMPLE_CLASSES = "radio_lit:sample_classes"
#: [choice] A classification accuracy is at chance level when it is no more than this many
#: binomial standard errors above chance (``p + z sqrt(p (1 - p) / N)``, N images evaluated).
CHANCE_Z = 3.0


def weights_step(tag: str, logged_step: int) -> int:
    """The optimizer step of the weights a ``tag`` point logged at ``logged_step`` measured
    (see the module docstring)."""
    return logged_step + 1 if tag.startswith("val/") else logged_step


def run_metrics(run_dir: str | Path, step: int | None = None) -> dict[str, tuple[int, float]]:
    """``{tag: (weights' step, value)}``: for each ``val/`` and ``eval/`` scalar in the
    TensorBoard event files under ``run_dir`` (curve points left out), the last value measured
    on the weights of ``step`` or an earlier step (all steps if ``None``), never a later one.

    Among points of one step (a run resumed into its folder logs some steps again) the one
    written last wins.
    """
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[str, tuple[int, float, float]] = {}
    for events in sorted(Path(run_dir).rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags().get("scalars", []):
            if not tag.startswith(_METRIC_PREFIXES) or _CURVE_POINT.search(tag):
                continue
            for point in accumulator.Scalars(tag):
                measured = weights_step(tag, point.step)
                if step is not None and measured > step:
                    continue
                candidate = (measured, point.wall_time, point.value)
                if tag not in found or candidate[:2] >= found[tag][:2]:
                    found[tag] = candidate
    return {tag: (s, value) for tag, (s, _, value) in sorted(found.items())}


#: Readable names of the logged scalars (docs/first-run.md, docs/evaluation.md): the tag's
#: pattern and the name, filled with the pattern's groups. Other tags keep their own name.
_NAMES = tuple(
    (re.compile(pattern), name)
    for pattern, name in (
        (r"val/loss", "validation loss (the training objective)"),
        (r"val/fidelity_geomean", "fidelity, geometric mean over the teachers"),
        (r"val/(?P<t>[^/]+)/feature_loss", "{t}: feature loss (normalized space)"),
        (r"val/(?P<t>[^/]+)/summary_loss", "{t}: summary loss"),
        (
            r"val/(?P<p>[^/]+)/(?P<t>[^/]+)/feature_loss",
            "{t}: feature loss in partition {p} (normalized space)",
        ),
        (r"val/(?P<p>[^/]+)/(?P<t>[^/]+)/summary_loss", "{t}: summary loss in partition {p}"),
        (r"val/(?P<t>[^/]+)/mse", "{t}: feature MSE in the teacher's space"),
        (r"val/(?P<t>[^/]+)/fidelity", "{t}: fidelity (teacher variance / MSE; 1 = the mean)"),
        (r"val/(?P<t>[^/]+)/fidelity_global", "{t}: fidelity around one global mean"),
        (r"val/(?P<t>[^/]+)/summary_cosine", "{t}: summary cosine similarity"),
        (
            r"val/(?P<t>[^/]+)/error_variance_range",
            "{t}: range of the error's channel variances (normalized space)",
        ),
        (
            r"val/(?P<t>[^/]+)/error_variance_range_teacher",
            "{t}: range of the error's channel variances (teacher's space)",
        ),
        (r"eval/knn/(?P<o>[^/]+)/top1", "kNN top-1 accuracy (%), {o} summary"),
        (r"eval/knn/(?P<o>[^/]+)/teacher_top1", "kNN top-1 accuracy (%) of the teacher {o}"),
        (r"eval/zero_shot/(?P<t>[^/]+)/top1", "zero-shot top-1 accuracy (%), {t} head"),
        (r"eval/zero_shot/(?P<t>[^/]+)/top5", "zero-shot top-5 accuracy (%), {t} head"),
        (
            r"eval/zero_shot/(?P<t>[^/]+)/agreement",
            "zero-shot agreement with the teacher {t} (% same top-1)",
        ),
        (
            r"eval/zero_shot/(?P<t>[^/]+)/teacher_top1",
            "zero-shot top-1 accuracy (%) of the teacher {t}",
        ),
        (
            r"eval/mode_switching/(?P<t>[^/]+)/jump_resolution",
            "{t}: resolution (px) where the head's error jumps most (mode switch)",
        ),
        (
            r"eval/mode_switching/(?P<t>[^/]+)/jump_ratio",
            "{t}: the head's error jump at that resolution (ratio)",
        ),
        (
            r"eval/scale_equivariance/(?P<o>[^/]+)/(?P<k>fine|coarse)",
            "scale equivariance sigma^2_scale, {k} scales ({o})",
        ),
        (r"eval/rankme/(?P<o>[^/]+)/(?P<k>[^/]+)", "RankMe effective rank, {o} {k}"),
        (
            r"eval/rankme_centered/(?P<o>[^/]+)/(?P<k>[^/]+)",
            "RankMe effective rank, {o} {k} centered",
        ),
        (
            r"eval/token_merging/(?P<o>[^/]+)/sink_(?P<s>[^/]+)/tokens_(?P<m>\d+)",
            "token merging to {m} tokens, {s} sinks: normalized MSE ({o})",
        ),
        (
            r"eval/segmentation/(?P<o>[^/]+)/miou_(?P<r>\d+)",
            "linear-probe segmentation mIoU (%) at {r} px ({o} features)",
        ),
    )
)


def metric_name(tag: str) -> str:
    """The name of a logged scalar a reader understands (``eval/knn/backbone/top1`` ->
    ``kNN top-1 accuracy (%), backbone summary``); an unknown tag is its own name."""
    for pattern, name in _NAMES:
        match = pattern.fullmatch(tag)
        if match is not None:
            return name.format(**match.groupdict())
    return tag


@dataclass(frozen=True)
class Headline:
    """A result of the card's ``model-index``: Hub task and metric types, and its data."""

    task: str
    metric: str
    dataset: str


@dataclass(frozen=True)
class _Measure:
    """The evaluation callback behind logged tags: the tags' pattern (its group selects the
    callback by ``selector``), the class name, the init argument naming its data, whether the
    tag is a headline result (``model-index``), and the top-k of an accuracy (0: none)."""

    pattern: str
    name: str
    data: str
    selector: str
    headline: bool = False
    top_k: int = 0


_MEASURES = (
    _Measure(r"eval/knn/([^/]+)/top1", "KNNClassification", "eval_dir", "outputs", True, 1),
    _Measure(r"eval/knn/([^/]+)/teacher_top1", "KNNClassification", "eval_dir", "outputs", top_k=1),
    _Measure(
        r"eval/zero_shot/([^/]+)/top1", "ZeroShotClassification", "eval_dir", "teacher", True, 1
    ),
    _Measure(
        r"eval/zero_shot/([^/]+)/top5", "ZeroShotClassification", "eval_dir", "teacher", top_k=5
    ),
    _Measure(
        r"eval/zero_shot/([^/]+)/teacher_top1",
        "ZeroShotClassification",
        "eval_dir",
        "teacher",
        top_k=1,
    ),
    _Measure(r"eval/zero_shot/([^/]+)/\w+", "ZeroShotClassification", "eval_dir", "teacher"),
    _Measure(r"eval/segmentation/([^/]+)/miou_\d+", "SegmentationProbe", "root", "output", True),
    _Measure(r"eval/rankme(?:_centered)?/([^/]+)/.+", "RankMe", "images", "outputs"),
    _Measure(r"eval/mode_switching/([^/]+)/.+", "ModeSwitching", "images", "teachers"),
    _Measure(r"eval/scale_equivariance/([^/]+)/.+", "ScaleEquivariance", "images", "outputs"),
    _Measure(r"eval/token_merging/([^/]+)/.+", "TokenMerging", "images", "outputs"),
)
_TASKS = {
    "KNNClassification": ("image-classification", "accuracy"),
    "ZeroShotClassification": ("zero-shot-image-classification", "accuracy"),
    "SegmentationProbe": ("image-segmentation", "mean_iou"),
}


class RunMeasures:
    """The evaluation callbacks of a run's config (``trainer.callbacks``): which data each
    logged measure ran on, and the chance level of its accuracies."""

    def __init__(self, run_config: Mapping[str, Any] | None) -> None:
        trainer = (run_config or {}).get("trainer") or {}
        callbacks = trainer.get("callbacks") or []
        self.callbacks = [c for c in callbacks if isinstance(c, Mapping)]
        self.data = (run_config or {}).get("data") or {}
        self._counts: dict[str, tuple[int, int] | None] = {}

    def headline(self, tag: str) -> Headline | None:
        """The ``model-index`` entry of ``tag`` (kNN and zero-shot top-1 of the student,
        segmentation mIoU), ``None`` for other tags."""
        found = self._measure(tag)
        if found is None or not found[0].headline:
            return None
        task, metric = _TASKS[found[0].name]
        return Headline(task, metric, str(self.dataset(tag)))

    def dataset(self, tag: str) -> str | None:
        """The data the measure of ``tag`` ran on, as the config gives it (``val/`` tags: the
        data module's ``val_dir``); ``None`` when unknown."""
        if tag.startswith("val/"):
            return (self.data.get("init_args") or {}).get("val_dir")
        found = self._measure(tag)
        if found is None:
            return None
        value = found[1].get(found[0].data)
        return None if value is None else str(value)

    def chance(self, tag: str) -> tuple[float, float] | None:
        """``(chance level %, at-chance threshold %)`` of an accuracy ``tag``: top-k of C
        classes is ``100 min(k, C) / C``; the threshold adds :data:`CHANCE_Z` binomial standard
        errors for the N images evaluated. ``None`` for other tags, or when the classes cannot
        be counted here (a folder of another machine)."""
        found = self._measure(tag)
        if found is None or not found[0].top_k:
            return None
        measure, args = found
        root = args.get(measure.data)
        counts = self._count(str(root), int(args.get("per_class") or 0)) if root else None
        if counts is None:
            return None
        classes, images = counts
        p = min(measure.top_k, classes) / classes
        margin = CHANCE_Z * math.sqrt(p * (1 - p) / images) if images else 0.0
        return 100 * p, 100 * (p + margin)

    def _measure(self, tag: str) -> tuple[_Measure, dict[str, Any]] | None:
        """The measure of ``tag`` and its callback's init args (over their defaults; empty
        when the config has no such callback)."""
        for measure in _MEASURES:
            match = re.fullmatch(measure.pattern, tag)
            if match is None:
                continue
            entries = [_with_defaults(c) for c in self.callbacks if _class_name(c) == measure.name]
            chosen = next((a for a in entries if _selects(a.get(measure.selector), match[1])), None)
            if chosen is None:  # none selects it: the first; no such callback: data unknown
                chosen = entries[0] if entries else {}
            return measure, chosen
        return None

    def _count(self, root: str, per_class: int) -> tuple[int, int] | None:
        """``(classes, images)`` of a labeled set as the measures read it."""
        if root not in self._counts:
            self._counts[root] = _labeled_counts(root, per_class)
        return self._counts[root]


def _selects(value: Any, wanted: str) -> bool:
    return wanted in value if isinstance(value, list) else value == wanted


def _class_name(spec: Any) -> str:
    path = spec.get("class_path", "") if isinstance(spec, Mapping) else str(spec or "")
    return str(path).rsplit(".", 1)[-1]


#: Where the measures live, for the defaults of a config entry that omits them.
_EVALUATION_MODULE = "radio_lit.evaluation"


def _with_defaults(spec: Mapping[str, Any]) -> dict[str, Any]:
    """A callback entry's ``init_args`` over its constructor's defaults (LightningCLI's
    ``config.yaml`` lists them all; a hand-written config may not). The class is found from
    its ``class_path`` when importable, else by name among radio-lit's measures."""
    args = dict(spec.get("init_args") or {})
    path = str(spec.get("class_path", ""))
    module, _, name = path.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module or _EVALUATION_MODULE), name)
    except (ImportError, AttributeError, ValueError):
        return args
    for parameter in inspect.signature(cls).parameters.values():
        if parameter.default is not inspect.Parameter.empty:
            args.setdefault(parameter.name, parameter.default)
    return args


def _labeled_counts(root: str, per_class: int) -> tuple[int, int] | None:
    """``(classes, images)`` of ``radio_lit:sample_classes`` (one class per shipped photograph,
    ``per_class`` crops each) or of a ``<root>/<class>/<images>`` folder; ``None`` if absent."""
    if root == SAMPLE_CLASSES:
        classes = len(list_images(sample_images_dir()))
        return classes, classes * per_class
    folder = Path(root).expanduser()
    if not folder.is_dir():
        return None
    subfolders = [p for p in folder.iterdir() if p.is_dir()]
    if not subfolders:
        return None
    return len(subfolders), sum(len(list_images(p)) for p in subfolders)
