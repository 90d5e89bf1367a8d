"""The model card (``README.md``) and licence note (``LICENSE.md``) of a Hugging Face export,
written from the exported checkpoint and its run.

The card states:

- its title and model name: ``--name``, else the run's (the logger's name in the run's
  ``config.yaml``, ``-ema`` added for EMA weights), never the output folder's;
- which weights it holds: the checkpoint, its optimizer step, raw or EMA
  (:mod:`radio_lit.export.source`);
- the teachers (weights ids, licences), the student, the recipe (normalizers, losses,
  balancer, optimizer, resolutions, and C-RADIOv4's parts where the run used them: shifts,
  DAMP, EMA/MESA, the angle-balanced summary loss) and the data, as the config gives them;
- the evaluation: each ``val/`` and ``eval/`` scalar the run logged for the weights of the
  checkpoint's step or an earlier one (:func:`~radio_lit.export.logged.run_metrics`, never a
  later step's), named for a reader, with the step it measured; accuracies at chance level
  marked. EMA weights list none: the run validates and evaluates the raw student only;
- a citation of the papers (AM-RADIO, RADIOv2.5, PHI-S; C-RADIOv4 where used), radio-lit's
  version and repository.

Its YAML front matter is the Hub's card metadata: ``library_name``, ``pipeline_tag``,
``tags``, ``license: other`` with ``license_name`` and ``license_link`` (``LICENSE.md``: the
teachers' licences, which govern the student until the user sets one), and a ``model-index``
of the kNN, zero-shot and segmentation results measured on exactly these weights and above
chance.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml

from radio_lit.export.logged import RunMeasures, metric_name
from radio_lit.export.source import EMA

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
#: Where each licence of :data:`LICENCES` is published.
LICENCE_LINKS = {
    "NVIDIA Open Model License": "https://developer.download.nvidia.com/licenses/"
    "nvidia-open-model-license-agreement-june-2024.pdf",
    "NVIDIA Source Code License-NC (non-commercial)": (
        "https://github.com/NVlabs/RADIO/blob/main/LICENSE"
    ),
    "SAM License (Meta)": "https://github.com/facebookresearch/sam3/blob/main/LICENSE",
    "DINOv3 License (Meta)": ("https://ai.meta.com/resources/models-and-libraries/dinov3-license/"),
    "apache-2.0": "https://www.apache.org/licenses/LICENSE-2.0",
    "MIT": "https://github.com/openai/CLIP/blob/main/LICENSE",
}
_RANDOM = "none: random weights, not pretrained"
#: The card's licence note, beside ``README.md`` (the front matter's ``license_link``).
LICENCE_NAME = "LICENSE.md"
#: radio-lit's repository, when the installed package's metadata names none.
REPOSITORY = "https://github.com/radio-lit/radio-lit"

#: The papers the card cites (BibTeX as their authors give it in NVlabs/RADIO's README).
CITATIONS = {
    "AM-RADIO": """@InProceedings{Ranzinger_2024_CVPR,
    author    = {Ranzinger, Mike and Heinrich, Greg and Kautz, Jan and Molchanov, Pavlo},
    title     = {AM-RADIO: Agglomerative Vision Foundation Model Reduce All Domains Into One},
    booktitle = {Proceedings of the IEEE/CVF Conference on Computer Vision and Pattern
                 Recognition (CVPR)},
    month     = {June},
    year      = {2024},
    pages     = {12490-12500}
}""",
    "RADIOv2.5": """@misc{heinrich2025radiov25improvedbaselinesagglomerative,
    title         = {RADIOv2.5: Improved Baselines for Agglomerative Vision Foundation Models},
    author        = {Greg Heinrich and Mike Ranzinger and Hongxu and Yin and Yao Lu and
                     Jan Kautz and Andrew Tao and Bryan Catanzaro and Pavlo Molchanov},
    year          = {2024},
    eprint        = {2412.07679},
    archivePrefix = {arXiv},
    primaryClass  = {cs.CV},
    url           = {https://arxiv.org/abs/2412.07679}
}""",
    "PHI-S": """@misc{ranzinger2024phisdistributionbalancinglabelfree,
    title         = {PHI-S: Distribution Balancing for Label-Free Multi-Teacher Distillation},
    author        = {Mike Ranzinger and Jon Barker and Greg Heinrich and Pavlo Molchanov and
                     Bryan Catanzaro and Andrew Tao},
    year          = {2024},
    eprint        = {2410.01680},
    archivePrefix = {arXiv},
    primaryClass  = {cs.LG},
    url           = {https://arxiv.org/abs/2410.01680}
}""",
    "C-RADIOv4": """@misc{cradiov4,
    title         = {C-RADIOv4 Tech Report},
    year          = {2026},
    eprint        = {2601.17237},
    archivePrefix = {arXiv},
    primaryClass  = {cs.CV},
    url           = {https://arxiv.org/abs/2601.17237}
}""",
}


def teacher_source(spec: Mapping[str, Any] | str) -> tuple[str, str, str]:
    """``(class, weights id, licence)`` of a teacher entry of a run's ``model.teachers``.

    The id is what the teacher loads: open_clip ``model_name`` + ``pretrained`` tag, a timm /
    Hugging Face ``model`` (with its ``checkpoint`` file if given), a SAM ``checkpoint``;
    weights built from a config alone (``pretrained: false``, no checkpoint) are random.
    """
    spec = {"class_path": spec} if isinstance(spec, str) else spec
    kind = _class_name(spec)
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


def run_name(checkpoint: str | Path, run_config: Mapping[str, Any] | None) -> str:
    """The name of the run that wrote ``checkpoint``: its logger's ``name`` in the run's
    config, else the folder above the run's (``<save_dir>/<name>/<version>/checkpoints/``)."""
    logger = ((run_config or {}).get("trainer") or {}).get("logger")
    for entry in logger if isinstance(logger, list) else [logger]:
        if isinstance(entry, Mapping) and (entry.get("init_args") or {}).get("name"):
            return str(entry["init_args"]["name"])
    run = Path(checkpoint).resolve().parent.parent
    return run.parent.name or run.name


def model_card(
    name: str,
    model_config: Mapping[str, Any],
    run_config: Mapping[str, Any] | None,
    metrics: Mapping[str, tuple[int, float]],
) -> str:
    """The card's markdown, front matter included.

    Args:
        name: the model's name (``--name`` or :func:`run_name`).
        model_config: the export's config (:func:`radio_lit.export.radio_config`), with its
            ``radio_lit.source`` (:mod:`radio_lit.export.source`).
        run_config: the run's ``config.yaml`` as a dict (teachers' sources, recipe, data,
            evaluation callbacks); ``None`` when unknown.
        metrics: ``{tag: (weights' step, value)}`` logged for these weights or earlier ones
            (:func:`~radio_lit.export.logged.run_metrics`); ignored for EMA weights.
    """
    run_config = run_config or {}
    model = run_config.get("model") or {}
    source = model_config["radio_lit"].get("source") or {}
    step, ema = source.get("step"), source.get("weights") == EMA
    measures = RunMeasures(run_config)
    metrics = {} if ema else metrics
    teachers = _teachers(model_config, model)
    front: dict[str, Any] = {
        "library_name": "radio-lit",
        "pipeline_tag": "image-feature-extraction",
        "tags": ["radio-lit", "radio", "agglomerative-model", "knowledge-distillation"],
        "license": "other",
        "license_name": "see-teacher-licences",
        "license_link": LICENCE_NAME,
    }
    results = _results(name, metrics, measures, step)
    if results:
        front["model-index"] = results
    extras = model_config["radio_lit"]
    height, width = extras["preferred_resolution"]
    c_radio = _c_radio_parts(model)
    lines = [
        "---",
        yaml.safe_dump(front, sort_keys=False, width=10_000).rstrip(),
        "---",
        "",
        f"# {name}",
        "",
        "A vision backbone distilled from several frozen teachers at once, without labels "
        "(agglomerative distillation: AM-RADIO, RADIOv2.5, PHI-S"
        + (", C-RADIOv4" if c_radio else "")
        + f"), trained with [radio-lit]({repository_url()}). Each teacher has an adaptor head that "
        "maps the student's summary and patch features into that teacher's own space.",
        "",
        "## Weights",
        "",
        *_weights_lines(source, run_config, model),
        "",
        "## Use",
        "",
        "```python",
        "import radio_lit  # pip install radio-lit: registers the model with transformers",
        "from transformers import AutoModel",
        "",
        'model = AutoModel.from_pretrained("<this folder or Hub id>")  # or radio_lit.load(...)',
        f"outputs = model(images)  # [B, 3, H, W] in [0, 1], H and W multiples of "
        f"{extras['patch_size']}",
        'outputs["backbone"].summary, outputs["backbone"].features  # [B, D], [B, h, w, D]',
        "# NVlabs' loader's backbone summary (its summary_idxs tokens concatenated, [B, k D]):",
        '# radio_lit.load(..., backbone_summary="summary_idxs")',
        "```",
        "",
        "Without `import radio_lit`, transformers asks for `trust_remote_code=True`: the "
        "folder's `radio_lit_auto.py` then imports the installed radio-lit's classes (it holds "
        "no model code of its own).",
        "",
        "## Teachers",
        "",
        "| adaptor | teacher | weights | licence | summary |",
        "|---|---|---|---|---|",
        *(
            f"| {n} | {kind} | {weights} | {licence} | {'yes' if summary else 'no'} |"
            for n, kind, weights, licence, summary in teachers
        ),
        "",
        "The student's weights are learned from these teachers' outputs: their licences govern "
        f"its use (the card's `license: other`, see [{LICENCE_NAME}]({LICENCE_NAME}), until you "
        "set one).",
        "",
        "## Student",
        "",
        f"- architecture: {model_config.get('model')} (patch {extras['patch_size']}, "
        f"{extras['num_cls_tokens']} summary token(s), {extras['num_registers']} register(s))",
        f"- preferred resolution: {height}x{width} px (any multiple of the patch size runs)",
        *_student_lines(model.get("student") or {}),
        "",
        "## Recipe",
        "",
        f"- optimizer steps: {step if step is not None else 'unknown'}",
        *_recipe_lines(model),
        *(
            ["", "C-RADIOv4's parts (tech report, arXiv 2601.17237):", "", *c_radio]
            if c_radio
            else []
        ),
        "",
        "## Data",
        "",
        *_data_lines(run_config.get("data")),
        "",
        "## Evaluation",
        "",
        *_evaluation_lines(metrics, measures, step, ema),
        "",
        "## Citation",
        "",
        f"Trained with radio-lit {_version()} ({repository_url()}), which implements these papers:",
        "",
        "```bibtex",
        "\n\n".join(text for paper, text in CITATIONS.items() if paper != "C-RADIOv4" or c_radio),
        "```",
    ]
    return "\n".join(lines) + "\n"


def licence_note(model_config: Mapping[str, Any], run_config: Mapping[str, Any] | None) -> str:
    """``LICENSE.md``: the teachers' licences, with links, and what the user has to set."""
    model = (run_config or {}).get("model") or {}
    rows = [
        f"| {n} | {weights} | "
        + (f"[{licence}]({LICENCE_LINKS[licence]})" if licence in LICENCE_LINKS else licence)
        + " |"
        for n, _, weights, licence, _ in _teachers(model_config, model)
    ]
    return "\n".join(
        [
            "# Licence",
            "",
            "radio-lit chooses no licence for a distilled model: its weights are learned from "
            "its teachers' outputs, and the teachers' licences govern its use. Before "
            "publishing, set in README.md's front matter the licence they allow (`license`, "
            "and `license_link` if you replace this file).",
            "",
            "| adaptor | teacher weights | licence |",
            "|---|---|---|",
            *rows,
            "",
        ]
    )


def _teachers(
    model_config: Mapping[str, Any], model: Mapping[str, Any]
) -> list[tuple[str, str, str, str, bool]]:
    specs = model.get("teachers") or {}
    rows = []
    for entry in model_config["teachers"]:
        kind, weights, licence = teacher_source(specs.get(entry["name"], entry["type"]))
        rows.append((entry["name"], kind, weights, licence, bool(entry["use_summary"])))
    return rows


def _results(
    name: str,
    metrics: Mapping[str, tuple[int, float]],
    measures: RunMeasures,
    step: int | None,
) -> list[dict[str, Any]]:
    """The ``model-index``: headline results measured on these very weights (at the
    checkpoint's step), chance-level accuracies left out."""
    results = []
    for tag, (measured, value) in metrics.items():
        headline = measures.headline(tag)
        chance = measures.chance(tag)
        if headline is None or measured != step or (chance and value <= chance[1]):
            continue
        results.append(
            {
                "task": {"type": headline.task},
                "dataset": {"name": headline.dataset, "type": headline.dataset},
                "metrics": [
                    {"type": headline.metric, "value": round(value, 4), "name": metric_name(tag)}
                ],
            }
        )
    return [{"name": name, "results": results}] if results else []


def _weights_lines(
    source: Mapping[str, Any], run_config: Mapping[str, Any], model: Mapping[str, Any]
) -> list[str]:
    checkpoint = source.get("checkpoint", "unknown")
    step = source.get("step")
    lines = [
        f"- checkpoint: `{checkpoint}`, saved at optimizer step "
        f"{step if step is not None else 'unknown'}",
    ]
    if source.get("weights") == EMA:
        mesa = (model.get("mesa") or {}).get("init_args") or {}
        decay = f", decay {mesa['decay']}" if "decay" in mesa else ""
        lines.append(
            "- weights: the **EMA** (exponential moving average) of the student and its heads"
            f"{decay} (C-RADIOv4 report 2.3.2), not the raw student"
        )
    else:
        lines.append("- weights: the student and its heads as trained (raw, not an EMA)")
    return lines


def _student_lines(student: Mapping[str, Any]) -> list[str]:
    if not student:
        return []
    args = student.get("init_args") or {}
    lines = [f"- student config: `{_class_name(student)}` `{_inline(args)}`"]
    if args.get("vitdet_window_sizes"):
        at_inference = args.get("vitdet_eval_window_size")
        lines.append(
            f"- ViTDet windowed attention in training: windows {args['vitdet_window_sizes']} "
            f"tokens, in {args.get('vitdet_probability', 1.0):g} of the steps (AM-RADIO "
            "supplement C, C-RADIOv4 report 3.2); at inference "
            + (f"windows of {at_inference} tokens" if at_inference else "global attention")
        )
    return lines


def _recipe_lines(model: Mapping[str, Any]) -> list[str]:
    lines = [f"- student resolution: {model.get('student_resolution', 'default')}"]
    for name, spec in (model.get("partitions") or {}).items():
        spec = spec or {}
        lines.append(
            f"- partition {name}: resolutions {spec.get('resolutions')}, batch "
            f"{spec.get('batch_size')}, teachers {spec.get('teachers') or 'all'}"
        )
    entries = (
        ("normalizer", "normalizer", "Identity (plain MSE targets)"),
        ("normalizer_overrides", "per-teacher normalizers", None),
        ("loss", "feature loss", "MSE"),
        ("summary_loss", "summary loss", "Cosine"),
        ("feature_weights", "feature loss weights", None),
        ("summary_weights", "summary loss weights", None),
        ("balancer", "balancer", "Weighted"),
        ("grid_policy", "loss grid", None),
        ("optimizer", "optimizer", None),
        ("warmup_steps", "warm-up steps", None),
        ("init_from", "initialized from", None),
    )
    for key, label, default in entries:
        value = model.get(key)
        if value is None and default is not None:
            lines.append(f"- {label}: {default} (default)")
        elif value is not None:
            lines.append(f"- {label}: {_describe(value)}")
    return lines


#: C-RADIOv4's parts: (config key, what, report section).
_C_RADIO = (
    ("shifts", "shift-equivariant dense loss", "2.3.1"),
    ("mesa", "EMA student and shift-equivariant MESA", "2.3.2"),
    ("damp", "DAMP multiplicative weight noise", "2.4"),
)


def _c_radio_parts(model: Mapping[str, Any]) -> list[str]:
    """C-RADIOv4's training parts this run used, one line each (none: an empty list)."""
    lines = [
        f"- {what} (report {section}): {_describe(model[key])}"
        for key, what, section in _C_RADIO
        if model.get(key) is not None
    ]
    if _class_name(model.get("summary_loss")) == "AngleBalanced":
        lines.append(
            f"- angle-balanced summary loss (report 2.5): {_describe(model['summary_loss'])}"
        )
    return lines


def _data_lines(data: Mapping[str, Any] | None) -> list[str]:
    """The training and validation data as the config gives them."""
    if not data:
        return ["- not recorded in the run's config"]
    args = data.get("init_args") or {}
    lines = [f"- data module: `{_class_name(data)}`"]
    for key, label in (
        ("train_dir", "training images"),
        ("urls", "training shards"),
        ("path", "teacher-feature cache"),
        ("val_dir", "validation images"),
    ):
        if args.get(key) is not None:
            lines.append(f"- {label}: `{_inline(args[key])}`")
    for key in ("crop_size", "batch_size"):
        if args.get(key) is not None:
            lines.append(f"- {key.replace('_', ' ')}: {args[key]}")
    if any(str(args.get(k, "")).startswith("radio_lit:") for k in ("train_dir", "val_dir")):
        lines.append(
            "- `radio_lit:sample_images` is the ten photographs shipped with radio-lit "
            "(a demonstration, not a training set)"
        )
    return lines


def _evaluation_lines(
    metrics: Mapping[str, tuple[int, float]],
    measures: RunMeasures,
    step: int | None,
    ema: bool,
) -> list[str]:
    if ema:
        return [
            "None listed: these are EMA weights, and the run validated and evaluated the raw "
            "student only, so none of its logged metrics describe them. Measure them with "
            "`radio-lit evaluate --model_path <this folder>`."
        ]
    if not metrics:
        at = f" at or before step {step}" if step is not None else ""
        return [f"Not evaluated: the run logged no val/ or eval/ metrics{at}."]
    lines = [
        "Each value is the last the run logged for the weights of this checkpoint's step "
        f"({step}) or an earlier one; *earlier* marks a value measured on earlier weights.",
        "",
        "| metric | value | measured at step | data | TensorBoard tag |",
        "|---|---|---|---|---|",
    ]
    notes = set()
    for tag, (measured, value) in metrics.items():
        shown = f"{value:.4g}"
        chance = measures.chance(tag)
        if chance is not None and value <= chance[1]:
            shown += f" (at chance: {chance[0]:.3g})"
            notes.add("chance")
        when = f"{measured}" + (" (earlier)" if step is not None and measured < step else "")
        data = measures.dataset(tag) or ""
        lines.append(
            f"| {metric_name(tag)} | {shown} | {when} | {f'`{data}`' if data else ''} | `{tag}` |"
        )
    if "chance" in notes:
        lines += [
            "",
            "*at chance*: not above the chance level of its classes (top-k of C classes: k/C) by "
            "more than three binomial standard errors over the images evaluated; left out of "
            "the card's model-index.",
        ]
    return lines


def _class_name(spec: Any) -> str:
    path = spec.get("class_path", "") if isinstance(spec, Mapping) else str(spec or "")
    return str(path).rsplit(".", 1)[-1]


def _describe(value: Any) -> str:
    """A config value on one line: a class as its name and arguments."""
    if isinstance(value, Mapping) and "class_path" in value:
        args = value.get("init_args")
        return f"`{_class_name(value)}`" + (f" `{_inline(args)}`" if args else "")
    return f"`{_inline(value)}`"


def _inline(value: Any) -> str:
    """A config value on one line (flow-style YAML for mappings and lists)."""
    if not isinstance(value, (dict, list)):
        return str(value)
    return yaml.safe_dump(value, default_flow_style=True, width=10_000).strip()


def _version() -> str:
    try:
        return metadata.version("radio-lit")
    except metadata.PackageNotFoundError:
        return "(version unknown)"


def repository_url() -> str:
    """radio-lit's repository, from the installed package's project URLs."""
    try:
        urls = metadata.metadata("radio-lit").get_all("Project-URL") or []
    except metadata.PackageNotFoundError:
        urls = []
    for entry in urls:
        url = entry.split(",", 1)[-1].strip()
        if url.startswith("https://github.com/"):
            return url.split("#", 1)[0]
    return REPOSITORY
