"""A Hugging Face model folder: ``config.json``, ``model.safetensors``,
``preprocessor_config.json``, ``radio_lit_auto.py``, a model card ``README.md`` and its
licence note ``LICENSE.md``.

``transformers.AutoModel.from_pretrained(folder)`` loads it with radio-lit imported
(:mod:`radio_lit.hf` registers the classes; no remote code), and so does
``radio_lit.load(folder)`` (without transformers: :func:`~radio_lit.export.files.read_hf`);
a Hub id works for both once the folder is pushed (``huggingface_hub.upload_folder``).
:func:`export_hf` writes it from a training checkpoint (``radio-lit export CKPT --format
hf``), :func:`save_hf` from an inference model.

- ``config.json``: :class:`~radio_lit.hf.configuration.RadioLitConfig`, whose ``radio`` entry
  is the export's RADIO config (the ``.json`` of a safetensors export, with the weights'
  source: :mod:`radio_lit.export.source`) and ``adaptors`` the adaptor MLPs' widths; its
  ``auto_map`` names ``radio_lit_auto.py``.
- ``radio_lit_auto.py``: what transformers runs for ``AutoModel.from_pretrained`` when
  radio-lit was not imported first. Without an ``auto_map``, transformers refuses the unknown
  ``model_type`` with "your version of Transformers is out of date ... pip install --upgrade
  transformers" (``AutoConfig.from_pretrained``), advice that never works; with it, it asks for
  ``trust_remote_code=True``, and this file then imports the installed radio-lit's classes (no
  model code of its own) or says which package to install. With radio-lit imported the local
  classes win and the file never runs (transformers' ``has_local_code``).
- ``model.safetensors``: the inference model's weights under ``radio_model.*`` (radio-lit's
  layer names), every teacher's normalizer folded into its feature head (PHI-S A.6).
- ``preprocessor_config.json``: a ``CLIPImageProcessor`` resizing to the preferred
  resolution and rescaling to ``[0, 1]`` without normalizing (the model applies its pixel
  statistics itself, as RADIO does), plus the input contract under ``radio_lit``: input
  range, pixel mean and std, patch size, preferred and supported resolutions.
- ``README.md`` and ``LICENSE.md``: :mod:`radio_lit.export.card`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from radio_lit.export.card import (
    LICENCE_NAME,
    licence_note,
    model_card,
    repository_url,
    run_name,
)
from radio_lit.export.checkpoint import run_config
from radio_lit.export.files import CONFIG_NAME, HF_PREFIX, WEIGHTS_NAME, save_umask_file
from radio_lit.export.logged import run_metrics
from radio_lit.export.model import RadioLitModel, adaptor_shapes, from_radio_keys
from radio_lit.export.progress import stages
from radio_lit.export.source import exported_model

PREPROCESSOR_NAME = "preprocessor_config.json"
CARD_NAME = "README.md"
#: The module ``config.json``'s ``auto_map`` names (see the module docstring).
AUTO_MODULE = "radio_lit_auto"
AUTO_MAP = {
    "AutoConfig": f"{AUTO_MODULE}.RadioLitConfig",
    "AutoModel": f"{AUTO_MODULE}.RadioLitHFModel",
}
#: ``radio_lit_auto.py``: radio-lit's classes under names of its own (transformers registers
#: the classes it loads this way for saving with their module; subclasses keep radio-lit's
#: own classes out of that).
AUTO_CODE = '''"""Loads this model with the installed radio-lit package ({repository}).

transformers runs this file for AutoModel.from_pretrained(..., trust_remote_code=True) when
radio-lit was not imported first. It holds no model code: it imports radio-lit's classes.
Importing radio-lit first needs no remote code:

    import radio_lit  # registers the model with transformers' Auto classes
    from transformers import AutoModel

    model = AutoModel.from_pretrained("<this folder or Hub id>")
"""

try:
    from radio_lit.hf.configuration import RadioLitConfig as _Config
    from radio_lit.hf.modeling import RadioLitHFModel as _Model
except ModuleNotFoundError as error:
    if error.name != "radio_lit":
        raise
    raise ImportError(
        "this model is a radio-lit export: install radio-lit (pip install radio-lit, or from "
        "{repository}), then import radio_lit before AutoModel.from_pretrained"
    ) from error


class RadioLitConfig(_Config):
    pass


class RadioLitHFModel(_Model):
    config_class = RadioLitConfig
'''


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


def save_hf(
    model: RadioLitModel, folder: str | Path, card: str, licence: str | None = None
) -> list[Path]:
    """Write ``model`` as a Hugging Face model folder with the model card ``card`` (and the
    licence note ``licence`` as ``LICENSE.md``). Files of those names are replaced: callers
    check first (``radio-lit export`` refuses a non-empty folder without ``--overwrite``).

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
        auto_map=AUTO_MAP,
    )
    config.save_pretrained(folder)
    # What RadioLitHFModel.save_pretrained writes: its state dict, under radio-lit's names.
    weights = {HF_PREFIX + k: v for k, v in from_radio_keys(state).items()}
    save_umask_file(weights, folder / WEIGHTS_NAME)
    (folder / PREPROCESSOR_NAME).write_text(json.dumps(preprocessor_config(model), indent=2) + "\n")
    (folder / f"{AUTO_MODULE}.py").write_text(AUTO_CODE.format(repository=repository_url()))
    texts = {CARD_NAME: card, **({LICENCE_NAME: licence} if licence is not None else {})}
    for name, text in texts.items():
        (folder / name).write_text(text)
    names = (CONFIG_NAME, WEIGHTS_NAME, PREPROCESSOR_NAME, f"{AUTO_MODULE}.py", *texts)
    return [folder / name for name in names]


def _device(model: RadioLitModel) -> Any:
    return next(model.parameters()).device


def export_hf(
    checkpoint: str | Path,
    folder: str | Path,
    config: str | Path | None = None,
    heads: list[str] | None = None,
    ema: bool = False,
    name: str | None = None,
) -> list[Path]:
    """Write the Hugging Face folder of a training checkpoint, its card written from the run
    (the config's teachers, recipe and data; the metrics the run folder's TensorBoard logs
    hold for the checkpoint's step or earlier: :mod:`radio_lit.export.card`).

    Args:
        checkpoint: a ``.ckpt`` written by ``radio-lit fit`` (``<run>/checkpoints/<name>.ckpt``).
        folder: the folder to write.
        config: the run's config (default: its ``config.yaml``).
        heads: the teachers whose adaptor heads the folder keeps (default: all).
        ema: export the EMA student and heads (``model.mesa``) instead of the raw weights.
        name: the model's name on its card (default: the run's, ``-ema`` added for ``ema``).
    """
    checkpoint, folder = Path(checkpoint), Path(folder)
    config = Path(config) if config is not None else run_config(checkpoint)
    with stages(3) as bar:
        bar.set_postfix_str("fold normalizers")
        model: RadioLitModel = select_heads(exported_model(checkpoint, config, ema), heads)
        bar.update()
        bar.set_postfix_str("read the run's logs")
        settings = yaml.safe_load(Path(config).read_text())
        step = model.config["radio_lit"]["source"]["step"]
        metrics = {} if ema else run_metrics(checkpoint.resolve().parent.parent, step)
        title = name or run_name(checkpoint, settings) + ("-ema" if ema else "")
        card = model_card(title, model.config, settings, metrics)
        bar.update()
        bar.set_postfix_str("write the folder")
        written = save_hf(model, folder, card, licence_note(model.config, settings))
        bar.update()
    return written
