"""A RADIO model as a teacher: compress a distilled agglomerative model into a smaller student.

Three sources, one output convention (RADIO's: ``{"backbone": (summary, features), <adaptor>:
(summary, features)}``, images in ``[0, 1]`` normalized by the model itself; the backbone
summary is the summary teachers' tokens concatenated, RADIO's ``summary_idxs``, and the
features are the patch tokens):

- ``loader: export`` — a file written by ``radio-lit export`` (or a training ``.ckpt``), read
  by :func:`radio_lit.load`; no code is executed.
- ``loader: transformers`` — NVlabs' Hugging Face repositories (``nvidia/C-RADIOv4-H``...) or
  a local folder in their layout (``radio-lit export --format timm`` writes one). By default
  (``backend: native``) through transformers' own ``RadioModel`` (transformers >= 5), which
  runs no repository code; it has the backbone only (no adaptor heads, no final norm, no
  ViTDet), so an ``adaptor`` other than ``backbone`` is refused in one line naming
  ``backend: remote_code``. ``backend: remote_code`` loads NVlabs' own code through
  ``AutoModel.from_pretrained(trust_remote_code=True)``, adaptors included.
- ``loader: torch_hub`` — NVlabs' published models through ``torch.hub.load(hub_repo,
  "radio_model", version=model, adaptor_names=...)``; ``hub_repo`` is ``NVlabs/RADIO`` or a
  local clone (``source="local"``): always NVlabs' code.

NVlabs' code runs only when asked: ``torch_hub`` and ``backend: remote_code`` need
``trust_remote_code: true`` (off by default); the teacher refuses them before anything is
downloaded otherwise. [choice] timm's C-RADIO classes (``naflexvit_*_radio_v4``) are not a
teacher source: timm keeps the summary tokens but not which of them RADIO's summary
concatenates (``summary_idxs``), which transformers' ``RadioModel`` loads with the weights.

Two facts of NVlabs' adaptors the teacher reads from the model rather than assumes:

- an adaptor whose feature MLP upsamples by ``u`` (``upsample_factor``) returns
  ``(h u) (w u)`` tokens for an ``h x w`` patch grid: the grid is derived from the token count
  (``u = sqrt(N / (h w))``), and a count that is no ``u^2`` multiple of the grid is refused;
- NVlabs builds a summary head for every adaptor, also for teachers distilled without a
  summary term (``use_summary: false`` in the checkpoint's ``args.teachers``, e.g. SAM: AM-RADIO
  3.4.1, lambda = 0): such a head was never trained, so its output is no target
  (:func:`trained_summary` reads ``use_summary``).
"""

from __future__ import annotations

import math
import os
from typing import Literal

import torch
from torch import Tensor, nn

from radio_lit.teachers._errors import require_file
from radio_lit.teachers.base import Teacher, TeacherOutput
from radio_lit.teachers.loading import TeacherDtype, cast, download_errors
from radio_lit.teachers.speed import TeacherSpeed


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
        backend: ``loader: transformers``: ``native`` (transformers' ``RadioModel``, no
            repository code; the backbone only) or ``remote_code`` (NVlabs' code, adaptors
            included; needs ``trust_remote_code``). Other loaders take ``native``.
        adaptor: ``"backbone"`` (the student trunk's own summary and features) or the name
            of one of the model's adaptors (a teacher it was distilled from: ``"siglip2-g"``,
            ``"dino_v2"``, ``"sam"``..., or a radio-lit export's teacher names).
        resolution: input side in pixels (default the model's preferred resolution).
        follow_student: view at the student's grid instead of ``resolution``.
        summary: use the chosen output's summary as a target. Default (``None``): when it
            was trained (an NVlabs adaptor whose teacher had ``use_summary: false`` has an
            untrained summary head: no summary, see the module docstring). ``True`` refuses
            an untrained or missing summary; ``False`` drops it (features only).
        hub_repo: ``torch_hub``: the GitHub repository or a local clone's directory.
        trust_remote_code: allow ``torch_hub`` / ``backend: remote_code`` to run NVlabs'
            code (required by both; never needed for ``export`` or the native backend).
        dtype: teacher precision; outputs stay float32.
        channels_last: convolution weights and views in channels-last memory format
            (:meth:`~radio_lit.teachers.Teacher.freeze`; docs/teachers.md). [choice]
        speed: compile, FP8 and attention-backend options of the encoder
            (:class:`~radio_lit.teachers.speed.TeacherSpeed`; docs/speed.md).
    """

    def __init__(
        self,
        model: str,
        loader: Literal["export", "torch_hub", "transformers"] = "export",
        backend: Literal["native", "remote_code"] = "native",
        adaptor: str = "backbone",
        resolution: int | None = None,
        follow_student: bool = False,
        summary: bool | None = None,
        hub_repo: str = "NVlabs/RADIO",
        trust_remote_code: bool = False,
        dtype: TeacherDtype | None = None,
        channels_last: bool = False,
        speed: TeacherSpeed | None = None,
    ) -> None:
        net, patch, preferred = _load(model, loader, backend, adaptor, hub_repo, trust_remote_code)
        resolution = resolution or preferred
        # the model normalizes its [0, 1] input itself: the view is only resized
        super().__init__(resolution, patch, (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), follow_student)
        self.model = cast(net, dtype)
        self.adaptor = adaptor
        self.loader = loader
        #: transformers' native RadioModel: one output, RadioModelOutput(summary, features).
        self.native = loader == "transformers" and backend == "native"
        self.use_summary = _use_summary(net, model, loader, adaptor, summary)
        self.freeze(channels_last, speed)
        probe = self.encode(torch.rand(1, 3, patch * 2, patch * 2, dtype=_dtype(self.model)))
        if summary and probe.summary is None:
            raise ValueError(
                f"RADIOTeacher: output {adaptor!r} of {model!r} has no summary; set summary: "
                "false (or leave it unset)."
            )
        self.has_summary = probe.summary is not None
        self._summary_dim = probe.summary.shape[-1] if probe.summary is not None else None
        self._feature_dim = probe.features.shape[-1]
        #: Feature cells per patch along each side (an upsampling adaptor's ``u``, else 1).
        self.upsample_factor = probe.features.shape[1] // 2

    @property
    def feature_dim(self) -> int:
        return self._feature_dim

    @property
    def summary_dim(self) -> int | None:
        return self._summary_dim

    @property
    def grid_size(self) -> tuple[int, int]:
        """``(H, W)`` of the feature map for a full view: ``u`` cells per patch and side."""
        side = self.resolution // self.patch_size * self.upsample_factor
        return side, side

    def encode(self, view: Tensor) -> TeacherOutput:
        """``[B, 3, H, W]`` in ``[0, 1]`` -> the chosen output: summary ``[B, C_s]`` (``None``
        without a trained one) and features ``[B, u H/p, u W/p, C]`` (``u``: the adaptor's
        upsampling factor, 1 for the backbone and most adaptors)."""
        # NVlabs' hub model takes the layout as an argument; its HF wrapper returns NLC
        outputs = (
            self.model(view, feature_fmt="NLC") if self.loader == "torch_hub" else self.model(view)
        )
        if self.native or not isinstance(outputs, dict):  # the backbone's (summary, features)
            outputs = {"backbone": outputs}
        if self.adaptor not in outputs:
            raise ValueError(
                f"RADIOTeacher: the model has no output {self.adaptor!r}; it has "
                f"{sorted(outputs)}. Set adaptor to one of them."
            )
        chosen = outputs[self.adaptor]  # TeacherOutput, or RADIO's RadioOutput namedtuple
        summary = chosen.summary if self.use_summary is not False else None
        features = chosen.features
        if features.ndim == 3:  # NLC -> [B, u h, u w, C]
            rows, cols = view.shape[-2] // self.patch_size, view.shape[-1] // self.patch_size
            factor = upsample_factor(features.shape[1], rows, cols, self.adaptor)
            features = features.reshape(len(view), rows * factor, cols * factor, -1)
        return TeacherOutput(summary=summary, features=features)


def upsample_factor(tokens: int, rows: int, cols: int, output: str) -> int:
    """``u`` with ``tokens == (u rows) (u cols)``: the cells per patch and side of an output
    (NVlabs' upsampling adaptors); ``ValueError`` when there is no such integer."""
    factor = math.isqrt(tokens // (rows * cols)) if tokens >= rows * cols else 0
    if factor == 0 or factor * factor * rows * cols != tokens:
        raise ValueError(
            f"RADIOTeacher: output {output!r} gave {tokens} tokens for a {rows}x{cols} patch "
            f"grid, which is no (u*{rows})x(u*{cols}) grid for an integer upsampling factor u; "
            "choose another adaptor."
        )
    return factor


def _use_summary(
    net: nn.Module, model: str, loader: str, adaptor: str, summary: bool | None
) -> bool | None:
    """Whether to use the chosen output's summary: ``summary`` as given, checked against
    whether NVlabs' model trained it (:func:`trained_summary`); ``None``: as the output gives
    it (a radio-lit export returns no summary where none was trained)."""
    if adaptor == "backbone" or loader == "export":
        return summary
    trained = trained_summary(net, model, loader, adaptor)
    if trained is None:
        return summary
    if summary and not trained:
        raise ValueError(
            f"RADIOTeacher: {model!r} was distilled from {adaptor!r} without a summary term "
            "(use_summary: false in its checkpoint): its summary head is untrained. Set "
            "summary: false (or leave it unset)."
        )
    return trained if summary is None else summary


def trained_summary(net: nn.Module, model: str, loader: str, adaptor: str) -> bool | None:
    """Whether NVlabs' model ``net`` trained ``adaptor``'s summary head: ``use_summary`` of
    its entry in the checkpoint's ``args.teachers`` (the HF config's ``args``, or the
    ``torch_hub`` checkpoint file's), else, for a hub version name, whether the adaptor's
    token slot (``head_idx``) is one of the model's ``summary_idxs`` (NVlabs' releases give
    each teacher its own slot); ``None`` when neither is known."""
    teachers = _checkpoint_teachers(net, model, loader)
    if teachers is not None:
        entry = next((t for t in teachers if t.get("name") == adaptor), None)
        return None if entry is None else bool(entry.get("use_summary", True))
    inner = getattr(net, "radio_model", net)  # the HF wrapper holds the hub model
    adaptors, trained_idxs = getattr(inner, "adaptors", None), getattr(inner, "summary_idxs", None)
    if adaptors is None or adaptor not in adaptors or trained_idxs is None:
        return None
    return int(adaptors[adaptor].head_idx) in trained_idxs.tolist()


def _checkpoint_teachers(net: nn.Module, model: str, loader: str) -> list[dict] | None:
    """``args.teachers`` of NVlabs' checkpoint where it can be read: the HF config's ``args``,
    or the ``torch_hub`` file ``model`` (memory-mapped: the weights are not read; the file was
    unpickled by the hub's code already, which ``trust_remote_code`` allowed)."""
    args = getattr(getattr(net, "config", None), "args", None)
    if args is None and loader == "torch_hub" and os.path.isfile(os.path.expanduser(model)):
        path = os.path.expanduser(model)
        try:
            checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=False)
        except RuntimeError:  # a legacy (non-zip) torch.save file cannot be memory-mapped
            checkpoint = torch.load(path, map_location="cpu", weights_only=False)
        args = checkpoint.get("args") if isinstance(checkpoint, dict) else None
    if args is None:
        return None
    teachers = args.get("teachers") if isinstance(args, dict) else getattr(args, "teachers", None)
    return list(teachers) if teachers is not None else None


def _dtype(net: nn.Module) -> torch.dtype:
    weight = next(net.parameters(), None)
    return torch.float32 if weight is None else weight.dtype


def _load(
    model: str, loader: str, backend: str, adaptor: str, hub_repo: str, trust_remote_code: bool
) -> tuple[nn.Module, int, int]:
    """``(model, patch size, preferred resolution)`` from ``loader`` and ``backend``."""
    if backend not in ("native", "remote_code"):
        raise ValueError(f"unknown backend {backend!r}; use native or remote_code.")
    if backend == "remote_code" and loader != "transformers":
        raise ValueError(
            f"RADIOTeacher: backend: remote_code applies to loader: transformers (loader "
            f"{loader!r} {'always runs NVlabs code' if loader == 'torch_hub' else 'runs none'})"
            "; leave backend unset."
        )
    if loader == "transformers" and backend == "native":
        return _native(model, adaptor)
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
            "set trust_remote_code: true to allow it (or use a radio-lit export file, or "
            "loader: transformers with backend: native for the backbone)."
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


def _native(model: str, adaptor: str) -> tuple[nn.Module, int, int]:
    """transformers' own ``RadioModel`` of an NVlabs-layout Hugging Face id or folder:
    ``(model, patch size, preferred resolution)``; runs no repository code."""
    if adaptor != "backbone":
        raise ValueError(
            f"RADIOTeacher: transformers' native RadioModel has no adaptor heads, so no output "
            f"{adaptor!r}; set backend: remote_code with trust_remote_code: true to run "
            "NVlabs' code (which has them), or use adaptor: backbone."
        )
    import transformers

    if not hasattr(transformers, "RadioModel"):
        raise ImportError(
            f"RADIOTeacher: transformers {transformers.__version__} has no native RadioModel "
            "(5.24 has it): upgrade transformers, or set backend: remote_code with "
            "trust_remote_code: true."
        )
    from transformers import RadioModel

    with download_errors("RADIOTeacher", model, _NATIVE_HINT):
        net, info = RadioModel.from_pretrained(model, output_loading_info=True)
    missing = sorted(info["missing_keys"]) + [str(k) for k in info.get("mismatched_keys", [])]
    if missing:
        raise ValueError(
            f"RADIOTeacher: {model!r} is not in NVlabs' C-RADIO layout that transformers' "
            f"RadioModel reads (missing or mismatched weights {missing[:3]}); for a radio-lit "
            "export use loader: export, for other NVlabs models backend: remote_code."
        )
    config = net.config
    ours = getattr(config, "radio_lit", None) or {}  # radio-lit export --format timm
    preferred = getattr(config, "preferred_resolution", None) or ours.get("preferred_resolution")
    return net, int(config.patch_size), int(preferred[0]) if preferred else 432


_NATIVE_HINT = (
    "Offline: download the repository once (hf download <id>) and give its folder as model, "
    "or use a radio-lit export file with loader: export."
)
_HUB_HINT = (
    "Offline: clone NVlabs/RADIO and give its directory as hub_repo with a downloaded "
    "checkpoint file as model, or use a radio-lit export file with loader: export."
)
