"""ONNX export of the inference model (normalizers folded), for onnxruntime and TensorRT.

The graph takes ``images [B, 3, H, W]`` in ``[0, 1]`` and returns the outputs of
:class:`~radio_lit.export.model.RadioLitModel` as named tensors, in this order:
``backbone.summary [B, D]``, ``backbone.features [B, h, w, D]``, then for each teacher
``<teacher>.summary [B, C_s]`` (teachers with a summary) and ``<teacher>.features [B, h, w, C]``.
The batch is dynamic; so are ``H`` and ``W`` (multiples of the patch size) for a CPE ViT, whose
position embeddings are resampled inside the graph. E-RADIO's windows depend on the map size, and
so does a ViT with ViTDet windows in eval mode: their graphs are fixed to the resolution given.
The exported config (the safetensors export's JSON) is stored in the file's metadata under
``radio_lit_config``.

Two files are written: ``<stem>.onnx`` (the graph) and ``<stem>.onnx.data`` (the weights, as
ONNX external data: torch's exporter writes them beside the graph, which keeps a model over
protobuf's 2 GB limit loadable). onnxruntime reads the ``.data`` file from the graph's folder:
keep the two together.

Written with ``torch.onnx.export(dynamo=True)`` (``torch.export`` + onnxscript; the TorchScript
exporter is deprecated in torch 2.9 and later). Needs ``pip install 'radio-lit[onnx]'``.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch
from torch import Tensor, nn

from radio_lit.export.model import RadioLitModel

#: Largest patch-grid side the dynamic height and width admit (4096 px at patch 16).
MAX_GRID_SIDE = 256


class NamedOutputs(nn.Module):
    """``images [B, 3, H, W]`` -> the model's output tensors as a tuple (:func:`output_names`)."""

    def __init__(self, model: RadioLitModel) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: Tensor) -> tuple[Tensor, ...]:
        outputs = self.model(images)
        return tuple(
            tensor
            for out in outputs.values()
            for tensor in (out.summary, out.features)
            if tensor is not None
        )


def output_names(model: RadioLitModel) -> list[str]:
    """The graph's output names, in :class:`NamedOutputs` order."""
    names = ["backbone.summary", "backbone.features"]
    for teacher in model.teacher_names:
        if teacher in model.summary_slots:
            names.append(f"{teacher}.summary")
        names.append(f"{teacher}.features")
    return names


def external_data(path: str | Path) -> Path:
    """The weights file beside the graph ``<stem>.onnx``: ``<stem>.onnx.data``."""
    path = Path(path)
    return path.with_name(path.name + ".data")


def dynamic_resolution(model: RadioLitModel) -> bool:
    """Whether the graph can take any ``H, W`` (a CPE ViT without eval-mode ViTDet windows)."""
    extras = model.config["radio_lit"]
    return extras.get("architecture") != "e-radio" and extras.get("vitdet_window_size") is None


def save_onnx(
    model: RadioLitModel, path: str | Path, resolution: tuple[int, int] | None = None
) -> Path:
    """Write ``model`` as ONNX to ``path`` (``.onnx``) and its weights to
    :func:`external_data` (``.onnx.data``); returns ``path``.

    Args:
        model: the exported model (:func:`radio_lit.load`, :func:`inference_model`).
        path: the file to write.
        resolution: ``(H, W)`` of the example input; the graph's fixed resolution where it is
            not dynamic. Default: the student's training resolution.
    """
    missing = [m for m in ("onnx", "onnxscript") if importlib.util.find_spec(m) is None]
    if missing:
        raise ImportError(
            f"ONNX export needs {' and '.join(missing)}: pip install 'radio-lit[onnx]'"
        )
    import onnx

    extras = model.config["radio_lit"]
    height, width = resolution or tuple(extras["preferred_resolution"])
    patch = model.patch_size
    if height % patch or width % patch:
        raise ValueError(
            f"ONNX export resolution {height}x{width} is not a multiple of the patch size {patch}"
        )
    path = Path(path).with_suffix(".onnx")
    path.parent.mkdir(parents=True, exist_ok=True)
    wrapper = NamedOutputs(model).eval()
    device = next(model.parameters()).device
    example = torch.rand(2, 3, height, width, device=device)
    dims = {0: torch.export.Dim("batch", min=1, max=4096)}
    if dynamic_resolution(model):
        dims[2] = patch * torch.export.Dim("grid_height", min=1, max=MAX_GRID_SIDE)
        dims[3] = patch * torch.export.Dim("grid_width", min=1, max=MAX_GRID_SIDE)
    torch.onnx.export(
        wrapper,
        (example,),
        str(path),
        input_names=["images"],
        output_names=output_names(model),
        dynamic_shapes={"images": dims},
        dynamo=True,
        verbose=False,
    )
    proto = onnx.load(str(path), load_external_data=False)  # >2 GB: weights stay beside
    entry = proto.metadata_props.add()
    entry.key, entry.value = "radio_lit_config", json.dumps(model.config)
    onnx.save(proto, str(path))
    return path
