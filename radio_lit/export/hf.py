"""A Hugging Face model folder: ``config.json``, ``model.safetensors``,
``preprocessor_config.json`` and a model card ``README.md``.

``transformers.AutoModel.from_pretrained(folder)`` loads it with radio-lit imported
(:mod:`radio_lit.hf` registers the classes; no remote code), and so does
``radio_lit.load(folder)`` (without transformers: :func:`~radio_lit.export.files.read_hf`);
a Hub id works for both once the folder is pushed (``huggingface_hub.upload_folder``).
:func:`export_hf` writes it from a training checkpoint (``radio-lit export CKPT --format
hf``), :func:`save_hf` from an inference model.

- ``config.json``: :class:`~radio_lit.hf.configuration.RadioLitConfig`, whose ``radio`` entry
  is the export's RADIO config (the ``.json`` of a safetensors export) and ``adaptors`` the
  adaptor MLPs' widths.
- ``model.safetensors``: the inference model's weights under ``radio_model.*`` (radio-lit's
  layer names), every teacher's normalizer folded into its feature head (PHI-S A.6).
- ``preprocessor_config.json``: a ``CLIPImageProcessor`` resizing to the preferred
  resolution and rescaling to ``[0, 1]`` without normalizing (the model applies its pixel
  statistics itself, as RADIO does), plus the input contract under ``radio_lit``: input
  range, pixel mean and std, patch size, preferred and supported resolutions.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
import yaml
from tqdm.auto import tqdm

from radio_lit.export.card import model_card, run_metrics
from radio_lit.export.checkpoint import checkpoint_inference_model, run_config
from radio_lit.export.files import CONFIG_NAME, HF_PREFIX, WEIGHTS_NAME, save_umask_file
from radio_lit.export.model import RadioLitModel, adaptor_shapes, from_radio_keys

PREPROCESSOR_NAME = "preprocessor_config.json"
CARD_NAME = "README.md"


def select_heads(model: RadioLitModel, teachers: list[str] | None) -> RadioLitModel:
    """``model`` with only the adaptor heads of ``teachers`` (all if ``None``), in its order.

    Raises:
        ValueError: naming a teacher the model does not have.
    """
    if teachers is None:
        return model
    unknown = [t for t in teachers if t not in model.teacher_names]
    if unknown:
        raise ValueError(
            f"--heads: the model has no teacher {unknown[0]!r}; choose among {model.teacher_names}"
        )
    config = json.loads(json.dumps(model.config))
    config["teachers"] = [t for t in config["teachers"] if t["name"] in teachers]
    dropped = tuple(
        f"{group}.{name}."
        for name in model.teacher_names
        if name not in teachers
        for group in ("_heads", "_feature_projections")
    )
    state = {k: v for k, v in model.radio_state_dict().items() if not k.startswith(dropped)}
    return RadioLitModel.from_radio(config, state, pad=model.pad).to(_device(model))


def preprocessor_config(model: RadioLitModel) -> dict[str, Any]:
    """The ``preprocessor_config.json`` of ``model`` (see the module docstring)."""
    extras = model.config["radio_lit"]
    height, width = (int(side) for side in extras["preferred_resolution"])
    conditioner = model.input_conditioner
    patch = model.patch_size
    supported: dict[str, Any] = {"multiple_of": patch, "min": patch}
    if "cpe_max_size" in model.config:
        supported["cpe_max"] = int(model.config["cpe_max_size"])
    return {
        "image_processor_type": "CLIPImageProcessor",
        "do_resize": True,
        "size": {"height": height, "width": width},
        "resample": 3,
        "do_center_crop": False,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": False,
        "do_convert_rgb": True,
        "radio_lit": {
            "input_range": [0.0, 1.0],
            "pixel_mean": conditioner.norm_mean.flatten().tolist(),
            "pixel_std": conditioner.norm_std.flatten().tolist(),
            "patch_size": patch,
            "preferred_resolution": [height, width],
            "supported_resolutions": supported,
        },
    }


def save_hf(model: RadioLitModel, folder: str | Path, card: str) -> list[Path]:
    """Write ``model`` as a Hugging Face model folder with the model card ``card``.

    Returns:
        the written files.
    """
    from radio_lit.hf.configuration import RadioLitConfig

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    state = model.radio_state_dict()
    config = RadioLitConfig(
        radio=json.loads(json.dumps(model.config)),
        adaptors=adaptor_shapes(model.config, state),
        architectures=["RadioLitHFModel"],
    )
    config.save_pretrained(folder)
    # What RadioLitHFModel.save_pretrained writes: its state dict, under radio-lit's names.
    weights = {HF_PREFIX + k: v for k, v in from_radio_keys(state).items()}
    save_umask_file(weights, folder / WEIGHTS_NAME)
    (folder / PREPROCESSOR_NAME).write_text(json.dumps(preprocessor_config(model), indent=2) + "\n")
    (folder / CARD_NAME).write_text(card)
    return [folder / name for name in (CONFIG_NAME, WEIGHTS_NAME, PREPROCESSOR_NAME, CARD_NAME)]


def _device(model: RadioLitModel) -> Any:
    return next(model.parameters()).device


def export_hf(
    checkpoint: str | Path,
    folder: str | Path,
    config: str | Path | None = None,
    heads: list[str] | None = None,
) -> list[Path]:
    """Write the Hugging Face folder of a training checkpoint, its card written from the run
    (the config's teachers, recipe and data; the metrics in the run folder's TensorBoard logs).

    Args:
        checkpoint: a ``.ckpt`` written by ``radio-lit fit`` (``<run>/checkpoints/<name>.ckpt``).
        folder: the folder to write.
        config: the run's config (default: its ``config.yaml``).
        heads: the teachers whose adaptor heads the folder keeps (default: all).
    """
    checkpoint, folder = Path(checkpoint), Path(folder)
    config = Path(config) if config is not None else run_config(checkpoint)
    with tqdm(total=3, unit="step", desc="export", dynamic_ncols=True) as bar:
        bar.set_postfix_str("fold normalizers")
        model: RadioLitModel = select_heads(checkpoint_inference_model(checkpoint, config), heads)
        bar.update()
        bar.set_postfix_str("read the run's logs")
        step = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True).get(
            "global_step"
        )
        card = model_card(
            folder.resolve().name,
            model.config,
            yaml.safe_load(Path(config).read_text()),
            step,
            run_metrics(checkpoint.parent.parent),
        )
        bar.update()
        bar.set_postfix_str("write the folder")
        written = save_hf(model, folder, card)
        bar.update()
    return written
