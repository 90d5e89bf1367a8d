"""A RADIO model as a teacher: compress a distilled agglomerative model into a smaller student.

Three sources, one output convention (RADIO's: ``{"backbone": (summary, features), <adaptor>:
(summary, features)}``, images in ``[0, 1]`` normalized by the model itself):

- ``loader: export`` — a file written by ``radio-lit export`` (or a training ``.ckpt``), read
  by :func:`radio_lit.load`; no code is executed.
- ``loader: torch_hub`` — NVlabs' published models through ``torch.hub.load(hub_repo,
  "radio_model", version=model, adaptor_names=...)``; ``hub_repo`` is ``NVlabs/RADIO`` or a
  local clone (``source="local"``).
- ``loader: transformers`` — NVlabs' Hugging Face repositories (``nvidia/C-RADIOv3-H``,
  ``nvidia/C-RADIOv4-H``...) through ``AutoModel.from_pretrained``.

The last two run the repository's own Python code, so they need ``trust_remote_code: true``
(off by default); the teacher refuses them before anything is downloaded otherwise.
"""

from __future__ import annotations

import os
from typing import Literal

import torch
from torch import Tensor, nn

from radio_lit.teachers._errors import require_file
from radio_lit.teachers.base import Teacher, TeacherOutput
from radio_lit.teachers.loading import TeacherDtype, cast, download_errors


class RADIOTeacher(Teacher):
    """Frozen RADIO model; targets are its backbone outputs or one of its adaptors'.

    Outputs for a view ``[B, 3, H, W]`` (``H, W`` multiples of the model's patch size; RADIO
    runs at any such resolution, so ``follow_student`` suits it): ``summary [B, C_s]`` (the
    chosen output's summary; ``None`` for an adaptor without one, e.g. SAM's) and
    ``features [B, H/p, W/p, C]``.

    Args:
        model: ``export``: the export file (``.safetensors`` / ``.pth`` / ``.ckpt``);
            ``torch_hub``: an NVlabs/RADIO version (``c-radio_v3-h``, ``radio_v2.5-l``...) or
            a checkpoint path that its ``hubconf`` accepts; ``transformers``: an HF id or a
            local directory.
        loader: where the model comes from (module docstring).
        adaptor: ``"backbone"`` (the student trunk's own summary and features) or the name
            of one of the model's adaptors (a teacher it was distilled from: ``"siglip2-g"``,
            ``"dino_v2"``, ``"sam"``..., or a radio-lit export's teacher names).
        resolution: input side in pixels (default the model's preferred resolution).
        follow_student: view at the student's grid instead of ``resolution``.
        hub_repo: ``torch_hub``: the GitHub repository or a local clone's directory.
        trust_remote_code: allow ``torch_hub`` / ``transformers`` to run the repository's
            code (required by both; never needed for ``export``).
        dtype: teacher precision; outputs stay float32.
    """

    def __init__(
        self,
        model: str,
        loader: Literal["export", "torch_hub", "transformers"] = "export",
        adaptor: str = "backbone",
        resolution: int | None = None,
        follow_student: bool = False,
        hub_repo: str = "NVlabs/RADIO",
        trust_remote_code: bool = False,
        dtype: TeacherDtype | None = None,
    ) -> None:
        net, patch, preferred = _load(model, loader, adaptor, hub_repo, trust_remote_code)
        resolution = resolution or preferred
        # the model normalizes its [0, 1] input itself: the view is only resized
        super().__init__(resolution, patch, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), follow_student)
        self.model = cast(net, dtype)
        self.adaptor = adaptor
        self.loader = loader
        self.freeze()
        probe = self.encode(torch.rand(1, 3, patch * 2, patch * 2, dtype=_dtype(self.model)))
        self.has_summary = probe.summary is not None
        self._summary_dim = probe.summary.shape[-1] if probe.summary is not None else None
        self._feature_dim = probe.features.shape[-1]

    @property
    def feature_dim(self) -> int:
        return self._feature_dim

    @property
    def summary_dim(self) -> int | None:
        return self._summary_dim

    def encode(self, view: Tensor) -> TeacherOutput:
        """``[B, 3, H, W]`` in ``[0, 1]`` -> the chosen output, features ``[B, H/p, W/p, C]``."""
        # NVlabs' hub model takes the layout as an argument; its HF wrapper returns NLC
        outputs = (
            self.model(view, feature_fmt="NLC") if self.loader == "torch_hub" else self.model(view)
        )
        if not isinstance(outputs, dict):  # NVlabs' model without adaptors: (summary, features)
            outputs = {"backbone": outputs}
        if self.adaptor not in outputs:
            raise ValueError(
                f"RADIOTeacher: the model has no output {self.adaptor!r}; it has "
                f"{sorted(outputs)}. Set adaptor to one of them."
            )
        chosen = outputs[self.adaptor]  # TeacherOutput, or RADIO's RadioOutput namedtuple
        summary, features = chosen.summary, chosen.features
        if features.ndim == 3:  # NLC -> [B, h, w, C]
            rows, cols = view.shape[-2] // self.patch_size, view.shape[-1] // self.patch_size
            features = features.reshape(len(view), rows, cols, -1)
        return TeacherOutput(summary=summary, features=features)


def _dtype(net: nn.Module) -> torch.dtype:
    weight = next(net.parameters(), None)
    return torch.float32 if weight is None else weight.dtype


def _load(
    model: str, loader: str, adaptor: str, hub_repo: str, trust_remote_code: bool
) -> tuple[nn.Module, int, int]:
    """``(model, patch size, preferred resolution)`` from ``loader``."""
    if loader == "export":
        file = require_file(model, "RADIOTeacher export", "Write one with radio-lit export.")
        from radio_lit.export.files import load  # the file format lives with the export

        net = load(file)
        if adaptor != "backbone" and adaptor not in net.teacher_names:
            raise ValueError(
                f"RADIOTeacher: {model!r} has no adaptor {adaptor!r}; its adaptors are "
                f"{net.teacher_names} (or use 'backbone')."
            )
        preferred = net.config["radio_lit"].get("preferred_resolution") or [256, 256]
        return net, net.patch_size, int(preferred[0])
    if loader not in ("torch_hub", "transformers"):
        raise ValueError(f"unknown loader {loader!r}; use export, torch_hub or transformers.")
    if not trust_remote_code:
        where = hub_repo if loader == "torch_hub" else model
        raise ValueError(
            f"RADIOTeacher: loading {model!r} with {loader} runs the Python code of {where!r}; "
            "set trust_remote_code: true to allow it (or use a radio-lit export file)."
        )
    adaptors = [] if adaptor == "backbone" else [adaptor]
    if loader == "torch_hub":
        local = os.path.isdir(os.path.expanduser(hub_repo))
        with download_errors("RADIOTeacher", model, _HUB_HINT):
            net = torch.hub.load(
                os.path.expanduser(hub_repo) if local else hub_repo,
                "radio_model",
                source="local" if local else "github",
                version=model,
                adaptor_names=adaptors or None,
                trust_repo=True,
            )
    else:
        from transformers import AutoConfig, AutoModel

        with download_errors("RADIOTeacher", model, _HUB_HINT):
            # NVlabs/RADIO README: set adaptor_names on the config, then load with it
            config = AutoConfig.from_pretrained(model, trust_remote_code=True)
            config.adaptor_names = adaptors or None
            net = AutoModel.from_pretrained(model, config=config, trust_remote_code=True)
    inner = getattr(net, "radio_model", net)  # the HF wrapper holds the hub model
    patch = int(getattr(inner, "patch_size", 16))
    preferred = getattr(inner, "preferred_resolution", None)
    side = int(preferred[0]) if preferred is not None else 432
    return net, patch, side


_HUB_HINT = (
    "Offline: clone NVlabs/RADIO and give its directory as hub_repo with a downloaded "
    "checkpoint file as model, or use a radio-lit export file with loader: export."
)
