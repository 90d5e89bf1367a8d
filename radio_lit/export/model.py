"""The exported inference model, laid out as an NVlabs/RADIO checkpoint.

Its modules carry the RADIO checkpoint's names, so its state dict *is* the file's
``state_dict`` (``base_model.*``, ``input_conditioner.*``, ``_heads.<teacher>.*``,
``_feature_projections.<teacher>.*``), up to the adaptor MLPs' layer names
(:data:`~radio_lit.export.layout.MLP_V2_NAMES`; the key map of both directions is
:mod:`radio_lit.export.layout`). Shapes (``D`` width, ``p`` patch, ``G`` CPE grid side,
``T`` summary tokens, ``R`` registers):

- ``input_conditioner.norm_mean``, ``norm_std`` ``[3, 1, 1]``: pixel normalization of
  ``[0, 1]`` images;
- ``base_model.patch_generator.embedder.weight [D, 3 p p]`` (no bias: the student's patch
  bias is folded into the position embedding), ``patch_generator.pos_embed [1, G G, D]``
  (row-major CPE grid), ``patch_generator.cls_token.token [T + R, D]`` (summary tokens, then
  registers); ``base_model.blocks.*`` and ``base_model.norm.*``: timm's;
- ``_heads.<teacher>`` (summary) and ``_feature_projections.<teacher>`` (features): RADIO's
  adaptor MLP "v2" with no inner block, ``fc1 -> final.0 (LayerNorm) -> GELU -> final.2``,
  which is radio-lit's :class:`~radio_lit.students.MLPHead` (``inp``, ``norm``, ``out``). The
  feature heads output the teacher's own space: the normalizer is folded into ``final.2``
  (PHI-S A.6).

An E-RADIO student (:class:`~radio_lit.students.ERadio`) is exported under
``base_model.model.*`` with its own layer names and its architecture in
``config["radio_lit"]["eradio"]``; NVlabs/RADIO cannot load it, radio-lit's loader can.

The forward follows the format's definition (NVlabs/RADIO ``RADIOModel.forward`` in eval
mode) and returns radio-lit's inference output, ``dict[str, TeacherOutput]``.
"""

from __future__ import annotations

from typing import Any

import timm
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from radio_lit.core.outputs import TeacherOutput
from radio_lit.export.layout import (
    ADAPTOR_PREFIXES,
    BASE,
    TIMM_UNUSED,
    from_radio_keys,
    to_radio_keys,
)
from radio_lit.students import ERadio, MLPHead
from radio_lit.students.cpe_vit import cpe_eval_window
from radio_lit.students.feature_normalizer import FeatureNormalizer, IntermediateFeatureNormalizer
from radio_lit.students.heads import mlp_shape
from radio_lit.students.vitdet import run_windowed


class InputConditioner(nn.Module):
    """``[B, 3, H, W]`` images in ``[0, 1]`` -> ``(x - mean) / std`` (RADIO's buffer names)."""

    def __init__(self, mean: tuple[float, ...], std: tuple[float, ...]) -> None:
        super().__init__()
        self.register_buffer("norm_mean", torch.tensor(mean, dtype=torch.float32).view(3, 1, 1))
        self.register_buffer("norm_std", torch.tensor(std, dtype=torch.float32).view(3, 1, 1))

    def forward(self, images: Tensor) -> Tensor:
        return (images - self.norm_mean) / self.norm_std


class ClassTokens(nn.Module):
    """The prefix tokens ``token [T + R, D]``: T summary tokens, then R registers."""

    def __init__(self, num_tokens: int, dim: int) -> None:
        super().__init__()
        self.token = nn.Parameter(torch.zeros(num_tokens, dim))


class PatchGenerator(nn.Module):
    """Patches, CPE position embeddings and prefix tokens: ``[B, 3, H, W] -> [B, P + h w, D]``.

    Eval-mode CPE (AM-RADIO 4): the ``G x G`` grid is bilinearly resized to the longest side
    of the patch grid (``align_corners`` as recorded; NVlabs/RADIO uses ``False``) and its
    top-left ``h x w`` window added to the patch embeddings.
    """

    def __init__(
        self,
        patch_size: int,
        dim: int,
        grid_side: int,
        num_prefix: int,
        align_corners: bool = False,
    ) -> None:
        super().__init__()
        self.patch_size = patch_size
        self.grid_side = grid_side
        self.align_corners = align_corners
        self.embedder = nn.Linear(3 * patch_size * patch_size, dim, bias=False)
        self.pos_embed = nn.Parameter(torch.zeros(1, grid_side * grid_side, dim))
        self.cls_token = ClassTokens(num_prefix, dim)

    def forward(self, images: Tensor) -> Tensor:
        p = self.patch_size
        dim = self.embedder.out_features
        # The embedder is a linear map of (c, y, x)-ordered patches: a stride-p convolution.
        kernel = self.embedder.weight.view(dim, 3, p, p)
        patches = F.conv2d(images, kernel, stride=p)  # [B, D, h, w]
        batch, _, h, w = patches.shape
        g = self.grid_side
        if (h, w) == (g, g):
            pos = self.pos_embed
        else:
            grid = self.pos_embed.float().view(g, g, dim).permute(2, 0, 1).unsqueeze(0)
            window = cpe_eval_window(grid, (h, w), self.align_corners)
            pos = window.flatten(2).transpose(1, 2).to(self.pos_embed.dtype)
        tokens = patches.flatten(2).transpose(1, 2) + pos
        prefix = self.cls_token.token.unsqueeze(0).expand(batch, -1, -1)
        return torch.cat([prefix.to(tokens.dtype), tokens], dim=1)


class RadioBackbone(nn.Module):
    """The student trunk in RADIO's layout (``base_model``): ``[B, 3, H, W] -> [B, P + h w, D]``
    normalized images to tokens after the final norm.

    With ``window_size``, the blocks marked in ``windowed`` attend within ViTDet windows
    (the student's ``vitdet_eval_window_size``, AM-RADIO supplement C) when the windows tile
    the patch grid; otherwise every block is global.
    """

    def __init__(
        self,
        patch_generator: PatchGenerator,
        blocks: nn.Module,
        norm: nn.Module,
        window_size: int | None = None,
        windowed: list[bool] | None = None,
    ) -> None:
        super().__init__()
        self.patch_generator = patch_generator
        self.blocks = blocks
        self.norm = norm
        self.window_size = window_size
        self.windowed = windowed

    def forward(self, images: Tensor) -> Tensor:
        tokens = self.patch_generator(images)
        p, window = self.patch_generator.patch_size, self.window_size
        h, w = images.shape[-2] // p, images.shape[-1] // p
        if window is None or self.windowed is None or h % window or w % window:
            return self.norm(self.blocks(tokens))
        prefix = self.patch_generator.cls_token.token.shape[0]
        return self.norm(run_windowed(self.blocks, tokens, prefix, (h, w), window, self.windowed))


class ERadioBackbone(nn.Module):
    """An E-RADIO student as the exported trunk (``base_model``): ``[B, 3, H, W]`` normalized
    images -> ``[B, T + h w, D]``, its ``T`` summary tokens then its output map, row-major
    (the token layout of :class:`RadioBackbone`, with no registers)."""

    def __init__(self, model: ERadio) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: Tensor) -> Tensor:
        out = self.model(images)
        return torch.cat([out.summary, out.features.flatten(1, 2)], dim=1)


def timm_trunk(config: dict[str, Any]) -> nn.Module:
    """The timm VisionTransformer that ``config["model"]`` and ``model_kwargs`` describe, as
    NVlabs/RADIO's ``create_model_from_args`` builds it (random weights, no classifier), without
    a pooling head, as the student (a base without a class token has no token pooling)."""
    kwargs = dict(config["model_kwargs"])
    kwargs.pop("weight_init", None)
    return timm.create_model(
        config["model"],
        pretrained=False,
        num_classes=config.get("num_classes") or 0,
        global_pool="",
        weight_init="skip",
        **kwargs,
    )


def unused_timm_parameters(config: dict[str, Any]) -> dict[str, Tensor]:
    """``base_model.<name>``: zeros for each parameter of the timm model ``config`` names that
    NVlabs' loader builds (``create_model_from_args``, then ``enable_cpe``, which leaves them)
    but the CPE trunk does not use; in the file so that the loader finds every key it expects
    (it warns ``Missing keys in state dict: ['reg_token']`` otherwise). Read back, they are
    dropped (:data:`~radio_lit.export.layout.TIMM_UNUSED`)."""
    with torch.device("meta"):
        vit = timm_trunk(config)
    return {
        BASE + name: torch.zeros(getattr(vit, name).shape)
        for name in TIMM_UNUSED
        if isinstance(getattr(vit, name, None), Tensor)
    }


class RadioLitModel(nn.Module):
    """A distilled student with teacher-space adaptors, for inference.

    Takes images ``[B, 3, H, W]`` in ``[0, 1]`` with ``H``, ``W`` multiples of the patch size
    (any size with ``pad=True``: the normalized image is zero-padded at the bottom and right
    to the next multiple, and the feature maps cover the padded image). Returns
    ``{"backbone": TeacherOutput(summary [B, D], features [B, h, w, D]),
    <teacher>: TeacherOutput(summary [B, C_s] | None, features [B, h, w, C])}`` with ``h, w``
    the patch grid; the backbone summary is the first summary token, each teacher's outputs
    are in its own space (normalizer folded into the heads, PHI-S A.6). With
    ``backbone_summary="summary_idxs"`` (``radio_lit.load(path,
    backbone_summary="summary_idxs")``) it is NVlabs' loader's instead, ``[B, k D]``: the
    summary tokens of the ``k`` summary teachers concatenated in token order (``summary_idxs``,
    NVlabs/RADIO ``hubconf.py`` and ``RADIOModel.forward``; one token: ``[B, D]``).

    Build it with :func:`radio_lit.load` (a file) or :func:`radio_lit.export.inference_model`
    (a training module); :meth:`from_radio` builds it from a config and state dict.

    Args:
        config: the RADIO ``args`` fields plus ``config["radio_lit"]`` (see
            :func:`radio_lit.export.convert.radio_config`).
        base_model: the trunk.
        input_conditioner: the pixel normalization.
        heads: summary heads by teacher name (every teacher; a teacher without a summary has
            a constant-zero placeholder, as RADIO's loader requires one).
        feature_projections: feature heads by teacher name.
        pad: accept any resolution by padding (see above).
        backbone_summary: ``"first"`` (``[B, D]``) or ``"summary_idxs"`` (NVlabs', above).
    """

    def __init__(
        self,
        config: dict[str, Any],
        base_model: RadioBackbone | ERadioBackbone,
        input_conditioner: InputConditioner,
        heads: dict[str, MLPHead],
        feature_projections: dict[str, MLPHead],
        pad: bool = False,
        feature_normalizer: FeatureNormalizer | None = None,
        intermediate_normalizer: IntermediateFeatureNormalizer | None = None,
        backbone_summary: str = "first",
    ) -> None:
        super().__init__()
        self.config = config
        self.input_conditioner = input_conditioner
        self.base_model = base_model
        self._heads = nn.ModuleDict(heads)
        self._feature_projections = nn.ModuleDict(feature_projections)
        # NVlabs' names (hubconf.radio_model): _feature_normalizer.*, applied to the features
        # before the adaptors (RADIOModel._extract_final); the intermediate one is carried.
        self._feature_normalizer = feature_normalizer
        self._intermediate_feature_normalizer = intermediate_normalizer
        self.pad = pad
        extras = config["radio_lit"]
        self.patch_size = int(extras["patch_size"])
        self.num_cls_tokens = int(extras["num_cls_tokens"])
        self.num_prefix = self.num_cls_tokens + int(extras["num_registers"])
        self.summary_slots = {
            t["name"]: int(t["token_slot"]) for t in config["teachers"] if t["use_summary"]
        }
        #: NVlabs' summary_idxs: the summary teachers' tokens, sorted (one token: ``[0]``)
        slots = sorted(set(self.summary_slots.values()))
        self.summary_idxs = slots if self.num_cls_tokens > 1 and slots else [0]
        self.backbone_summary = backbone_summary
        self.eval()

    @property
    def backbone_summary(self) -> str:
        """How ``outputs["backbone"].summary`` is read: ``"first"`` or ``"summary_idxs"``."""
        return self._backbone_summary

    @backbone_summary.setter
    def backbone_summary(self, value: str) -> None:
        if value not in ("first", "summary_idxs"):
            raise ValueError(
                f"backbone_summary={value!r}: use 'first' (the first summary token, [B, D]) or "
                "'summary_idxs' (NVlabs' loader's, the summary teachers' tokens concatenated)"
            )
        self._backbone_summary = value

    @property
    def teacher_names(self) -> list[str]:
        return [t["name"] for t in self.config["teachers"]]

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_radio(
        cls, config: dict[str, Any], state: dict[str, Tensor], pad: bool = False
    ) -> RadioLitModel:
        """Build the model ``config`` describes and load ``state`` (RADIO key names) strictly."""
        model = cls.from_shapes(config, adaptor_shapes(config, state), pad=pad)
        if "_feature_normalizer.mean" in state:
            model._feature_normalizer = FeatureNormalizer(
                state["_feature_normalizer.mean"].shape[0]
            )
        means = state.get("_intermediate_feature_normalizer.means")
        if means is not None:
            per_layer = state["_intermediate_feature_normalizer.rotation"].ndim == 3
            model._intermediate_feature_normalizer = IntermediateFeatureNormalizer(
                *means.shape, rotation_per_layer=per_layer
            )
        model.load_state_dict(from_radio_keys(state), strict=True)
        return model

    @classmethod
    def from_shapes(
        cls, config: dict[str, Any], shapes: dict[str, list[int]], pad: bool = False
    ) -> RadioLitModel:
        """The model ``config`` describes with adaptor MLPs of ``shapes`` (see
        :func:`adaptor_shapes`), its weights not loaded (random)."""
        extras = config["radio_lit"]
        heads, projections = {}, {}
        for teacher in config["teachers"]:
            name = teacher["name"]
            heads[name] = MLPHead(*shapes[f"_heads.{name}"])
            projections[name] = MLPHead(*shapes[f"_feature_projections.{name}"])
        backbone = (
            ERadioBackbone(ERadio(**extras["eradio"]))
            if extras.get("architecture") == "e-radio"
            else _vit_trunk(config)
        )
        return cls(
            config,
            backbone,
            InputConditioner((0.0, 0.0, 0.0), (1.0, 1.0, 1.0)),
            heads,
            projections,
            pad=pad,
        )

    def radio_state_dict(self) -> dict[str, Tensor]:
        """The state dict under RADIO's key names (contiguous tensors, detached), with the
        parameters NVlabs' loader builds from ``args.model`` that the CPE trunk does not use
        (timm's ``reg_token`` of ``vit_*_radio_v4``: :func:`unused_timm_parameters`)."""
        state = {k: v.detach().contiguous() for k, v in to_radio_keys(self.state_dict()).items()}
        if self.config["radio_lit"].get("architecture") != "e-radio":
            state.update(unused_timm_parameters(self.config))
        return state

    # -- forward ------------------------------------------------------------------------------
    def forward(self, images: Tensor) -> dict[str, TeacherOutput]:
        x = self.input_conditioner(images)
        height, width = x.shape[-2:]
        p = self.patch_size
        if height % p or width % p:
            if not self.pad:
                raise ValueError(
                    f"input {height}x{width} is not a multiple of the patch size {p}; resize it, "
                    "or load the model with radio_lit.load(path, pad=True) to pad it"
                )
            x = F.pad(x, (0, -width % p, 0, -height % p))
        h, w = x.shape[-2] // p, x.shape[-1] // p
        dtype = next(self.base_model.parameters()).dtype
        tokens = self.base_model(x.to(dtype))
        batch, _, dim = tokens.shape
        summary = tokens[:, : self.num_cls_tokens]
        features = tokens[:, self.num_prefix :].reshape(batch, h, w, dim)
        if self._feature_normalizer is not None:
            features = self._feature_normalizer(features)
        if self.backbone_summary == "summary_idxs":
            backbone = summary[:, self.summary_idxs].flatten(1)  # [B, k D], NVlabs' order
        else:
            backbone = summary[:, 0]
        outputs = {"backbone": TeacherOutput(summary=backbone, features=features)}
        for name, projection in self._feature_projections.items():
            slot = self.summary_slots.get(name)
            outputs[name] = TeacherOutput(
                summary=self._heads[name](summary[:, slot]) if slot is not None else None,
                features=projection(features),
            )
        return outputs


def _vit_trunk(config: dict[str, Any]) -> RadioBackbone:
    """The CPE ViT trunk (random weights) that a RADIO config describes."""
    extras = config["radio_lit"]
    vit = timm_trunk(config)
    patch = int(extras["patch_size"])
    generator = PatchGenerator(
        patch,
        int(vit.embed_dim),
        grid_side=int(config["cpe_max_size"]) // patch,
        num_prefix=int(extras["num_cls_tokens"]) + int(extras["num_registers"]),
        align_corners=bool(extras["cpe_align_corners"]),
    )
    norm = vit.norm if config["model_norm"] else nn.Identity()
    return RadioBackbone(
        generator,
        vit.blocks,
        norm,
        extras.get("vitdet_window_size"),
        extras.get("vitdet_windowed"),
    )


def adaptor_shapes(config: dict[str, Any], state: dict[str, Tensor]) -> dict[str, list[int]]:
    """``{"_heads.<teacher>" | "_feature_projections.<teacher>": MLPHead.shape}``: the
    widths and depth of every teacher's adaptor MLPs "v2" stored in ``state`` (RADIO key
    names)."""
    renamed = from_radio_keys(state)
    shapes = {}
    for teacher in config["teachers"]:
        for group in ADAPTOR_PREFIXES:
            prefix = f"{group}{teacher['name']}."
            try:
                shapes[prefix[:-1]] = mlp_shape(renamed, prefix)
            except KeyError as missing:
                raise ValueError(
                    f"the state dict has no adaptor MLP 'v2' under {prefix!r} (missing "
                    f"{missing}); is this a radio-lit export?"
                ) from None
    return shapes


def zero_summary_head(in_dim: int) -> MLPHead:
    """A summary head whose output is always ``0`` (``[..., in_dim] -> [..., 1]``).

    NVlabs/RADIO's loader builds a summary MLP for every adaptor it loads, so a teacher
    without a summary (SAM) is exported with this placeholder; radio-lit returns ``None``.
    """
    head = MLPHead(in_dim, 1, 1)
    for param in head.parameters():
        nn.init.zeros_(param)
    return head
