"""E-RADIO: the efficient hybrid CNN-Transformer student (AM-RADIO section 5, supplement A).

Figure 5's layout, for an input ``[B, 3, H, W]`` and embedding width ``d`` (supplement A.2:
XT 64, T 80, S 96, B 128, L 192; all other settings shared by the family):

====================  ==========================================  ========  ========
part                  what                                        stride    channels
====================  ==========================================  ========  ========
stem                  two 3x3 stride-2 convolutions               4         d
stage 1               C2f, 3 bottlenecks (YOLOv8)                 4         d
downsample            3x3 stride-2 conv + BatchNorm               8         2d
stage 2               C2f, 3 bottlenecks                          8         2d
downsample                                                        16        4d
stage 3               5 multi-resolution attention layers, w 7    16        4d
downsample                                                        32        8d
stage 4               5 windowed attention layers, w 7            32        8d
upsample + add        2x deconvolution of stage 4, added to 3     16        4d
====================  ==========================================  ========  ========

The output is the stride-16 map (section 5: "only a 16x spatial resolution reduction"), so
``patch_size`` is 16 and ``embed_dim`` is ``4 d`` (B: 512, L: 768). Values the paper leaves
open are marked [choice] where they are set: channels doubling per stage as in FasterViT, whose
stage layout E-RADIO follows; stage 3 interleaves 2x-subsampled and local layers starting with
a subsampled one (layers 1, 3, 5 of 5: of the two interleavings, the one closer to AM-RADIO
table 7's parameter counts, see :class:`ERadio`); head width 64; MLP ratio 4; a LayerNorm on the
output map; summary tokens from attention pooling of the output map (timm's
``AttentionPoolLatent``, one learned query per summary token), since E-RADIO has no CLS token.

Any ``H, W`` multiple of 16 is accepted: the normalized image is zero-padded at the bottom and
right to a multiple of 32 (stage 4's stride), and the output map cropped back to
``H / 16 x W / 16`` [choice]. Windows larger than a map shrink to it; maps that windows do not
tile are padded inside attention with the padding masked out.

This implementation follows the paper, independently of NVlabs' E-RADIO v2 code
(``radio/eradio_model.py`` in NVlabs/RADIO, a non-commercial licence: read for these facts
only), which differs from it where the paper is silent: its stage-3 layers are pairs of blocks
(one per subsample ratio) where this one interleaves single layers; its summary is the mean of
the output map (here attention pooling); its windowed attention adds a continuous relative
position bias (Swin V2's MLP) where this one has a depthwise-convolution position encoding;
its multi-resolution blocks average the residual and the block's output (``0.5 x + 0.5
skip``) where this one adds them; its stem has an intermediate width before ``d``; and its
attention and MLP linear layers have no biases (here they do, as timm's). Weights trained by
one cannot be loaded into the other, which is why ``radio-lit export --format radio`` refuses
an E-RADIO student.

Layout for speed (the computation is the one above): convolutions run on ``channels_last``
maps with ``channels_last`` weights, the transformer stages on ``[B, h, w, C]`` token maps (a
view of the same memory), projections and MLPs only on the map's own tokens (window padding
exists only inside attention), and in eval mode each BatchNorm is folded into its convolution.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.layers import AttentionPoolLatent
from torch import Tensor, nn

from radio_lit.students.base import Student, StudentOutput
from radio_lit.students.eradio_layers import (
    C2f,
    ConvNormAct,
    MultiResolutionLayer,
    conv_on_tokens,
    downsample,
    upsample,
)
from radio_lit.students.spectral_reparam import enable_spectral_reparam

Triple = tuple[float, float, float]

#: Embedding widths ``d`` of the E-RADIO family (AM-RADIO supplement A.2).
ERADIO_WIDTHS = {"xt": 64, "t": 80, "s": 96, "b": 128, "l": 192}

#: Output stride (section 5) and the input multiple stage 4 needs.
OUTPUT_STRIDE = 16
INPUT_MULTIPLE = 32


class ERadio(Student):
    """The E-RADIO student: ``[B, 3, H, W]`` normalized images -> :class:`StudentOutput`.

    Same contract as :class:`~radio_lit.students.CPEViT`: ``summary [B, T, D]`` and
    ``features [B, H / 16, W / 16, D]`` after the final norm, ``patch_size`` 16, ``embed_dim``
    ``D = 4 width``, ``num_cls_tokens`` ``T``, ``pixel_mean`` / ``pixel_std``, and the
    transformer layers in ``blocks`` (stage 3's, then stage 4's; FSDP2 shards per block).

    Parameters with one summary token: E-RADIO-B (``width=128``) 108.6M, E-RADIO-L
    (``width=192``) 244.2M, against AM-RADIO table 7's 118M and 265M (-8%; the ratio L / B is
    the paper's, 2.25 = (192 / 128)^2: the counts scale with ``d^2`` as the table's do, and the
    gap is in settings the paper leaves open, see the module docstring).

    Args:
        width: embedding width ``d`` (supplement A.2: 128 for B, 192 for L).
        depths: layers per stage: C2f bottlenecks of stages 1-2, transformer layers of stages
            3-4 (supplement A.2: 3, 3, 5, 5; XT and T use 1, 3, 4, 5).
        window_size: attention window side in stride-16 / stride-32 positions (A.2: 7).
        head_dim: channels per attention head [choice: 64].
        mlp_ratio: transformer MLP width over the channels [choice: 4].
        num_cls_tokens: summary tokens (one shared, one per summary teacher, or one per
            teacher), each a learned attention-pooling query over the output map.
        pixel_mean: input normalization mean [choice: ImageNet's].
        pixel_std: input normalization std.
        spectral_reparam: σReparam on every linear layer of the transformer layers (PHI-S A.7;
            off by default [choice]: AM-RADIO used it against high-resolution ViT instability).
        checkpoint: optional local file with a ``state_dict`` of this model to start from.
    """

    def __init__(
        self,
        width: int = ERADIO_WIDTHS["b"],
        depths: tuple[int, int, int, int] = (3, 3, 5, 5),
        window_size: int = 7,
        head_dim: int = 64,
        mlp_ratio: float = 4.0,
        num_cls_tokens: int = 1,
        pixel_mean: Triple | None = None,
        pixel_std: Triple | None = None,
        spectral_reparam: bool = False,
        checkpoint: str | None = None,
    ) -> None:
        super().__init__()
        if width < 1 or width % 2:
            raise ValueError(f"E-RADIO width must be a positive even number, got {width}")
        if len(depths) != 4 or min(depths) < 1:
            raise ValueError(f"depths must be 4 positive layer counts, got {depths}")
        if (4 * width) % head_dim:
            raise ValueError(
                f"head_dim {head_dim} must divide the stage-3 width {4 * width} (4 x width)"
            )
        if num_cls_tokens < 1:
            raise ValueError("num_cls_tokens must be at least 1")
        if window_size < 1:
            raise ValueError(f"window_size must be positive, got {window_size}")
        self.arch = {
            "width": width,
            "depths": list(depths),
            "window_size": window_size,
            "head_dim": head_dim,
            "mlp_ratio": mlp_ratio,
            "num_cls_tokens": num_cls_tokens,
        }
        self.patch_size = OUTPUT_STRIDE
        self.embed_dim = 4 * width
        self.num_cls_tokens = num_cls_tokens
        self.num_registers = 0
        self.pixel_mean: Triple = tuple(pixel_mean or IMAGENET_DEFAULT_MEAN)
        self.pixel_std: Triple = tuple(pixel_std or IMAGENET_DEFAULT_STD)

        d = width
        self.stem = nn.Sequential(ConvNormAct(3, d, 3, 2), ConvNormAct(d, d, 3, 2))
        self.stage1 = C2f(d, depths[0])
        self.down1 = downsample(d, 2 * d)
        self.stage2 = C2f(2 * d, depths[1])
        self.down2 = downsample(2 * d, 4 * d)
        self.down3 = downsample(4 * d, 8 * d)
        stage3 = [
            MultiResolutionLayer(4 * d, 4 * d // head_dim, window_size, mlp_ratio, i % 2 == 0)
            for i in range(depths[2])
        ]
        stage4 = [
            MultiResolutionLayer(8 * d, 8 * d // head_dim, window_size, mlp_ratio, False)
            for _ in range(depths[3])
        ]
        self.blocks = nn.ModuleList(stage3 + stage4)
        self.stage3_depth = depths[2]
        self.up = upsample(8 * d, 4 * d)
        self.norm = nn.LayerNorm(self.embed_dim)
        self.summary_pool = AttentionPoolLatent(
            self.embed_dim,
            num_heads=self.embed_dim // head_dim,
            mlp_ratio=mlp_ratio,
            latent_len=num_cls_tokens,
            pool_type="",
            norm_layer=nn.LayerNorm,
        )
        self.summary_norm = nn.LayerNorm(self.embed_dim)
        if spectral_reparam:
            enable_spectral_reparam(self.blocks)
        # Convolution weights in the maps' memory format: no per-call reordering.
        self.to(memory_format=torch.channels_last)
        if checkpoint is not None:
            path = Path(checkpoint)
            if not path.is_file():
                raise FileNotFoundError(f"student checkpoint {path} does not exist")
            self.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))

    def forward_features(self, images: Tensor) -> Tensor:
        """Normalized images ``[B, 3, H, W]`` -> output map ``[B, H / 16, W / 16, D]`` before
        the final norm (H, W multiples of 16)."""
        height, width = images.shape[-2:]
        if height % OUTPUT_STRIDE or width % OUTPUT_STRIDE:
            raise ValueError(
                f"student input {height}x{width} is not a multiple of the E-RADIO output stride "
                f"{OUTPUT_STRIDE}; pick a student resolution divisible by {OUTPUT_STRIDE}"
            )
        x = F.pad(images, (0, -width % INPUT_MULTIPLE, 0, -height % INPUT_MULTIPLE))
        x = self.stage1(self.stem(x.contiguous(memory_format=torch.channels_last)))
        x = self.down2(self.stage2(self.down1(x)))
        x = x.permute(0, 2, 3, 1)  # token map [B, h, w, C]: a view of channels_last
        for layer in self.blocks[: self.stage3_depth]:
            x = layer(x)
        y = conv_on_tokens(self.down3, x)
        for layer in self.blocks[self.stage3_depth :]:
            y = layer(y)
        x = x + conv_on_tokens(self.up, y)
        return x[:, : height // OUTPUT_STRIDE, : width // OUTPUT_STRIDE]

    def forward(self, images: Tensor) -> StudentOutput:
        """Normalized images ``[B, 3, H, W]`` -> ``summary [B, T, D]`` and
        ``features [B, H / 16, W / 16, D]``, both after their final LayerNorm."""
        features = self.norm(self.forward_features(images))
        batch, h, w, dim = features.shape
        summary = self.summary_norm(self.summary_pool(features.reshape(batch, h * w, dim)))
        return StudentOutput(summary=summary, features=features)
