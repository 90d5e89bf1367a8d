"""The model card (``README.md``) of a Hugging Face export, written from the run.

It names the teachers (their weights' ids and licences), the student, the recipe and steps,
the data source as configured, and the final evaluation metrics found in the run's
TensorBoard logs (``val/...`` and ``eval/...`` scalars, the last value of each), or says
that the model was not evaluated. Its YAML front matter is the Hub's card metadata
(``library_name``, ``pipeline_tag``, ``tags``, ``license`` and, for the metrics,
``model-index``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

#: Licences of known teacher weights: (substring of the teacher's weights id, licence), the
#: first match wins; other pretrained weights are marked "unknown: see <id>".
LICENCES = (
    ("c-radio", "NVIDIA Open Model License"),
    ("radio", "NVIDIA Source Code License-NC (non-commercial)"),
    ("sam3", "SAM License (Meta)"),
    ("dinov3", "DINOv3 License (Meta)"),
    ("dinov2", "apache-2.0"),
    ("siglip", "apache-2.0"),
    ("sam2", "apache-2.0"),
    ("sam", "apache-2.0"),
    ("openai", "MIT"),
)
_RANDOM = "none: random weights, not pretrained"
_METRIC_PREFIXES = ("val/", "eval/")
#: Curves' points (``<tag>/step_<training step>``, x = student resolution) are no final metric.
_CURVE_POINT = re.compile(r"/step_\d+$")
#: The headline results in the card's ``model-index``: (tag pattern, Hub task type).
HEADLINE = (
    (re.compile(r"eval/segmentation/.+/miou_\d+"), "image-segmentation"),
    (re.compile(r"eval/(knn|zero_shot)/.+/top1"), "image-classification"),
)


def teacher_source(spec: Mapping[str, Any] | str) -> tuple[str, str, str]:
    """``(class, weights id, licence)`` of a teacher entry of a run's ``model.teachers``.

    The id is what the teacher loads: open_clip ``model_name`` + ``pretrained`` tag, a timm /
    Hugging Face ``model`` (with its ``checkpoint`` file if given), a SAM ``checkpoint``;
    weights built from a config alone (``pretrained: false``, no checkpoint) are random.
    """
    spec = {"class_path": spec} if isinstance(spec, str) else spec
    kind = str(spec.get("class_path", "")).rsplit(".", 1)[-1]
    args = spec.get("init_args") or {}
    name = args.get("model_name") or args.get("model") or args.get("model_type") or kind
    pretrained = args.get("pretrained", True if "model_name" not in args else None)
    checkpoint = args.get("checkpoint")
    if isinstance(pretrained, str):
        weights = f"{name} ({pretrained})"
    elif checkpoint:
        weights = f"{name} ({checkpoint})"
    elif pretrained and kind != "SAMTeacher":
        weights = str(name)
    else:
        return kind, f"{name} (random)", _RANDOM
    lowered = weights.lower()
    licence = next((lic for key, lic in LICENCES if key in lowered), f"unknown: see {weights}")
    return kind, weights, licence


def run_metrics(run_dir: str | Path) -> dict[str, tuple[int, float]]:
    """``{tag: (step, value)}``: the last value of each ``val/`` and ``eval/`` scalar in the
    TensorBoard event files under ``run_dir`` (curve points left out)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found: dict[str, tuple[float, int, float]] = {}
    for events in sorted(Path(run_dir).rglob("events.out.tfevents.*")):
        accumulator = EventAccumulator(str(events), size_guidance={"scalars": 0})
        accumulator.Reload()
        for tag in accumulator.Tags().get("scalars", []):
            if not tag.startswith(_METRIC_PREFIXES) or _CURVE_POINT.search(tag):
                continue
            last = accumulator.Scalars(tag)[-1]
            if tag not in found or (last.step, last.wall_time) >= found[tag][1::-1]:
                found[tag] = (last.wall_time, last.step, last.value)
    return {tag: (step, value) for tag, (_, step, value) in sorted(found.items())}


def model_card(
    name: str,
    model_config: Mapping[str, Any],
    run_config: Mapping[str, Any] | None,
    step: int | None,
    metrics: Mapping[str, tuple[int, float]],
) -> str:
    """The card's markdown, front matter included.

    Args:
        name: the model's name (the folder's).
        model_config: the export's config (:func:`radio_lit.export.radio_config`).
        run_config: the run's ``config.yaml`` as a dict (teachers' sources, recipe, data);
            ``None`` when unknown.
        step: the checkpoint's optimizer step.
        metrics: :func:`run_metrics`.
    """
    run_config = run_config or {}
    model = run_config.get("model") or {}
    teacher_specs = model.get("teachers") or {}
    teachers = []
    for entry in model_config["teachers"]:
        kind, weights, licence = teacher_source(teacher_specs.get(entry["name"], entry["type"]))
        teachers.append((entry["name"], kind, weights, licence, entry["use_summary"]))
    front: dict[str, Any] = {
        "library_name": "radio-lit",
        "pipeline_tag": "image-feature-extraction",
        "tags": ["radio-lit", "radio", "agglomerative-model", "knowledge-distillation"],
        "license": "other",
        "license_name": "see-teacher-licences",
    }
    scores = [
        (tag, task, value)
        for tag, (_, value) in metrics.items()
        for pattern, task in HEADLINE
        if pattern.fullmatch(tag)
    ]
    if scores:
        front["model-index"] = [
            {
                "name": name,
                "results": [
                    {
                        "task": {"type": task},
                        "dataset": {"name": "as configured in the run", "type": "custom"},
                        "metrics": [{"type": tag, "value": round(value, 4), "name": tag}],
                    }
                    for tag, task, value in scores
                ],
            }
        ]
    extras = model_config["radio_lit"]
    height, width = extras["preferred_resolution"]
    lines = [
        "---",
        yaml.safe_dump(front, sort_keys=False).rstrip(),
        "---",
        "",
        f"# {name}",
        "",
        "A vision backbone distilled from several frozen teachers at once, without labels "
        "(agglomerative distillation: AM-RADIO, RADIOv2.5, PHI-S), trained with "
        "radio-lit. Each teacher has an adaptor head that maps the "
        "student's summary and patch features into that teacher's own space.",
        "",
        "## Use",
        "",
        "```python",
        "import radio_lit  # registers the model with transformers' Auto classes",
        "from transformers import AutoModel",
        "",
        'model = AutoModel.from_pretrained("<this folder or Hub id>")  # or radio_lit.load(...)',
        f"outputs = model(images)  # [B, 3, H, W] in [0, 1], H and W multiples of "
        f"{extras['patch_size']}",
        'outputs["backbone"].summary, outputs["backbone"].features  # [B, D], [B, h, w, D]',
        "```",
        "",
        "## Teachers",
        "",
        "| adaptor | teacher | weights | licence | summary |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {n} | {kind} | {weights} | {licence} | {'yes' if summary else 'no'} |"
        for n, kind, weights, licence, summary in teachers
    ]
    lines += [
        "",
        "The student's weights are learned from these teachers' outputs: their licences govern "
        "its use (the card's `license: other` until you set one).",
        "",
        "## Student",
        "",
        f"- architecture: {model_config.get('model')} (patch {extras['patch_size']}, "
        f"{extras['num_cls_tokens']} summary token(s), {extras['num_registers']} register(s))",
        f"- preferred resolution: {height}x{width} px (any multiple of the patch size runs)",
    ]
    student = model.get("student") or {}
    if student:
        lines.append(f"- student config: `{_inline(student)}`")
    lines += ["", "## Recipe", ""]
    lines.append(f"- optimizer steps: {step if step is not None else 'unknown'}")
    for key in ("student_resolution", "normalizer", "loss", "balancer", "optimizer"):
        if model.get(key) is not None:
            lines.append(f"- {key}: `{_inline(model[key])}`")
    lines += ["", "## Data", ""]
    data = run_config.get("data")
    lines.append(f"- `{_inline(data)}`" if data else "- not recorded")
    lines += ["", "## Evaluation", ""]
    if metrics:
        lines += ["| metric | value | step |", "|---|---|---|"]
        lines += [f"| {tag} | {value:.4g} | {s} |" for tag, (s, value) in metrics.items()]
    else:
        lines.append("not evaluated (no val/ or eval/ metrics in the run's logs)")
    return "\n".join(lines) + "\n"


def _inline(value: Any) -> str:
    """A config value on one line (flow-style YAML for mappings and lists)."""
    if not isinstance(value, (dict, list)):
        return str(value)
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()
