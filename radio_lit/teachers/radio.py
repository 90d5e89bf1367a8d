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

The entries of one model share it (``share``, on by default): the backbone and each adaptor
are separate teachers of the run, and the model is held once and run once per view for all
of them (:mod:`radio_lit.teachers.radio_source`).

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
from typing import Any, Literal

import torch
from torch import Tensor, nn

from radio_lit.teachers.base import Teacher, TeacherOutput
from radio_lit.teachers.loading import TeacherDtype
from radio_lit.teachers.radio_source import radio_source
from radio_lit.teachers.speed import EncoderRunner, TeacherSpeed


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
        share: hold the model once and run it once per view for every entry of the run
            with the same source options (its backbone and each adaptor as separate
            teachers; :mod:`radio_lit.teachers.radio_source`, docs/teachers.md). ``false``:
            a model of this entry's own.
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
        share: bool = True,
    ) -> None:
        _check_adaptor(model, loader, backend, adaptor)
        sharing = (channels_last, repr(speed)) if share else None
        source = radio_source(model, loader, backend, hub_repo, trust_remote_code, dtype, sharing)
        source.serve(self, adaptor)
        net = source.net
        if loader == "export":
            _check_export_adaptor(net, model, adaptor)
        resolution = resolution or source.preferred
        # the model normalizes its [0, 1] input itself: the view is only resized
        mean, std = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)
        super().__init__(resolution, source.patch_size, mean, std, follow_student)
        self.model = net
        #: The loaded model and its kept outputs, shared with the run's other entries of it.
        self.source = source
        self.adaptor = adaptor
        self.loader = loader
        #: transformers' native RadioModel: one output, RadioModelOutput(summary, features).
        self.native = loader == "transformers" and backend == "native"
        self.use_summary = _use_summary(net, model, loader, adaptor, summary)
        self.freeze(channels_last)
        self._reported(source.speed(speed, "RADIOTeacher"))
        patch = self.patch_size
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
        #: The crop and view size of the call in progress (:meth:`forward`).
        self._crop: Tensor | None = None
        self._size: tuple[int, ...] | None = None

    @property
    def feature_dim(self) -> int:
        return self._feature_dim

    @property
    def summary_dim(self) -> int | None:
        return self._summary_dim

    @property
    def backbone_of(self) -> str | None:
        """The model path, for the backbone's own output (``adaptor: backbone``)."""
        return str(self.source.options[0]) if self.adaptor == "backbone" else None

    @property
    def grid_size(self) -> tuple[int, int]:
        """``(H, W)`` of the feature map for a full view: ``u`` cells per patch and side."""
        side = self.resolution // self.patch_size * self.upsample_factor
        return side, side

    @torch.no_grad()
    def forward(self, crop: Tensor, size: tuple[int, int] | None = None) -> TeacherOutput:
        """:meth:`Teacher.forward <radio_lit.teachers.Teacher.forward>`, the model run once
        per view for every teacher sharing it (:mod:`radio_lit.teachers.radio_source`)."""
        self._crop, self._size = crop, tuple(size or (self.resolution, self.resolution))
        try:
            return super().forward(crop, size)
        finally:
            self._crop = None

    def run_encoder(self, view: Tensor) -> TeacherOutput:
        """The chosen output of the shared model's outputs on ``view``: computed once for the
        teachers sharing the model when called from :meth:`forward` (its crop and size
        identify the view), with the speed options' runner where there is one."""
        outputs = self.source.outputs(self, self._crop, self._size, view)
        return self._chosen(outputs, view)

    def compile(self, *args: Any, **kwargs: Any) -> None:
        """``model.compile``: the shared model's call compiled once for all its teachers."""
        self._reported(self.source.compile(dict(kwargs) or True, "RADIOTeacher"))

    def _reported(self, runner: EncoderRunner | None) -> None:
        """The shared runner as this teacher's ``speed_runner`` (what ``SpeedReport`` reports)
        for the first teacher of the model only: its compile times and FP8 layers once."""
        self.speed_runner = runner if self.source.lead is self else None

    def encode(self, view: Tensor) -> TeacherOutput:
        """``[B, 3, H, W]`` in ``[0, 1]`` -> the chosen output: summary ``[B, C_s]`` (``None``
        without a trained one) and features ``[B, u H/p, u W/p, C]`` (``u``: the adaptor's
        upsampling factor, 1 for the backbone and most adaptors). One plain model call."""
        return self._chosen(self.source.call(view), view)

    def _chosen(self, outputs: Any, view: Tensor) -> TeacherOutput:
        """This teacher's output of the model's ``outputs`` on ``view``."""
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


def _check_adaptor(model: str, loader: str, backend: str, adaptor: str) -> None:
    """Refuse, before anything is loaded, an adaptor that transformers' native RadioModel
    cannot have (it has the backbone only)."""
    if loader == "transformers" and backend == "native" and adaptor != "backbone":
        raise ValueError(
            f"RADIOTeacher: transformers' native RadioModel has no adaptor heads, so no output "
            f"{adaptor!r}; set backend: remote_code with trust_remote_code: true to run "
            "NVlabs' code (which has them), or use adaptor: backbone."
        )


def _check_export_adaptor(net: nn.Module, model: str, adaptor: str) -> None:
    """Refuse an adaptor a radio-lit export does not have, naming those it has."""
    if adaptor != "backbone" and adaptor not in net.teacher_names:
        raise ValueError(
            f"RADIOTeacher: {model!r} has no adaptor {adaptor!r}; its adaptors are "
            f"{net.teacher_names} (or use 'backbone')."
        )
