"""Tiny teachers with the activation statistics of real ones (PHI-S appendix A.4, table 7).

PHI-S (section 1, figure 2, table 7) starts from the observation that real teachers' features
have very different scales: SAM's global standard deviation is 191 times DFN CLIP's, and within
one teacher the per-channel means and standard deviations vary by orders of magnitude. That
imbalance is what the loss normalizers of section 2.2 exist for. Tiny random-weight teachers
(the only kind an offline CPU machine can run) end in a LayerNorm and all produce features of
about unit scale, so small-scale ablations on them would not show the effect.

:class:`RescaledTeacher` wraps any :class:`~radio_lit.teachers.Teacher` and passes its features
through a fixed affine map ``y = A x + b`` chosen so that the wrapped teacher's features have a
given global mean and standard deviation and given extremes of the per-channel means and
standard deviations (:class:`FeatureStatistics`; :data:`TABLE7` holds the paper's four
teachers). The map is deterministic (seeded) and affine, so the student can learn it exactly,
and the normalizers see a realistic covariance: correlated channels, very unequal variances,
offset means, and, when ``dim`` exceeds the inner width, a rank-deficient covariance as in
PHI-S table 6.

How the map is derived (all in float64, once, at construction):

1. **Calibration.** The inner teacher runs on a fixed set of views: every image of
   ``calibration_images`` as a center crop plus ``calibration_views - 1`` seeded random-resized
   crops (the training crops' scale range). This gives ``X [N, C_in]``, its per-channel mean
   ``m`` and standard deviation ``s``.
2. **Mixing.** ``P [dim, C_in]`` has orthonormal columns (``dim >= C_in``) or rows, from the QR
   decomposition of a seeded Gaussian matrix. ``U = P ((X - m) / s)`` mixes the standardized
   channels, so the per-channel scales set next are not aligned with the inner teacher's
   principal axes (PHI-S A.5.3: real distributions are far from aligned with any canonical
   basis). ``r`` is the per-channel standard deviation of ``U``.
3. **Target channel statistics** (:func:`channel_targets`): per-channel standard deviations
   ``sigma [dim]`` and means ``mu [dim]`` that take exactly the table's extremes (one channel
   each at the minimum and maximum std, one each at the minimum and maximum mean) while the
   other channels spread seeded uniform values so that the global mean
   ``mean_c(mu_c)`` and global variance ``mean_c(sigma_c^2) + mean_c((mu_c - mean)^2)`` equal
   the table's. The remaining variance is split evenly between the two spreads.
4. **Map.** ``A = diag(sigma / r) P diag(1 / s)``, ``b = mu - A m``: on the calibration views
   every channel then has exactly the target mean and std, hence the target global mean and
   std. On other views of similar images the statistics hold approximately.

The summary vector is passed through unchanged: table 7 describes the spatial features, and
the summary loss (cosine, AM-RADIO eq. 2) is scale invariant.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

from radio_lit.data.image_folder import SAMPLE_IMAGES, list_images, resolve_image_root
from radio_lit.data.transforms import eval_transform, load_rgb, train_transform
from radio_lit.data.views import as_float_images
from radio_lit.teachers.base import Teacher, TeacherOutput

__all__ = [
    "TABLE7",
    "FeatureStatistics",
    "RescaledTeacher",
    "calibration_features",
    "calibration_views",
    "channel_targets",
    "feature_statistics",
]


@dataclass(frozen=True)
class FeatureStatistics:
    """Activation statistics of a teacher's spatial features ``[..., C]`` (PHI-S table 7).

    Attributes:
        mean: global mean over all elements.
        std: global standard deviation over all elements.
        channel_mean: ``(min, max)`` over channels of the per-channel means.
        channel_std: ``(min, max)`` over channels of the per-channel standard deviations.
    """

    mean: float
    std: float
    channel_mean: tuple[float, float]
    channel_std: tuple[float, float]

    def __post_init__(self) -> None:
        low_mean, high_mean = self.channel_mean
        low_std, high_std = self.channel_std
        if not 0.0 < low_std <= high_std:
            raise ValueError(f"channel_std must satisfy 0 < min <= max, got {self.channel_std}")
        if not low_mean < self.mean < high_mean:
            raise ValueError(
                f"the global mean {self.mean} must lie strictly inside channel_mean "
                f"{self.channel_mean}"
            )
        if self.std < low_std:
            raise ValueError(
                f"the global std {self.std} cannot be below the smallest channel std {low_std}"
            )


#: PHI-S table 7 (appendix A.4): DFN CLIP ViT-H/14-378, SigLIP so400m, DINOv2-g-reg, SAM ViT-H.
#: Their feature widths are 1280, 1152, 1536 and 256.
TABLE7: dict[str, FeatureStatistics] = {
    "dfn_clip": FeatureStatistics(0.0049, 0.0286, (-0.1689, 0.1385), (0.0105, 0.1334)),
    "siglip": FeatureStatistics(0.0211, 1.8389, (-6.8789, 31.25), (0.3813, 21.6875)),
    "dinov2": FeatureStatistics(0.0055, 1.3496, (-3.3945, 4.293), (0.3918, 4.3008)),
    "sam": FeatureStatistics(1.1475, 5.4688, (-62.0312, 19.1719), (2.6953, 31.6094)),
}

Preset = Literal["dfn_clip", "siglip", "dinov2", "sam"]


def feature_statistics(features: Tensor) -> FeatureStatistics:
    """Measure :class:`FeatureStatistics` of ``features [..., C]`` (population moments)."""
    flat = features.reshape(-1, features.shape[-1]).double()
    means, stds = flat.mean(0), flat.std(0, correction=0)
    return FeatureStatistics(
        mean=flat.mean().item(),
        std=flat.std(correction=0).item(),
        channel_mean=(means.min().item(), means.max().item()),
        channel_std=(stds.min().item(), stds.max().item()),
    )


def _minimum_variance(stats: FeatureStatistics, dim: int) -> float:
    """Global variance when every channel but the extremes sits at the smallest std and at the
    mean that keeps the global mean (the least variance ``dim`` channels with these extremes
    can have)."""
    (mu_lo, mu_hi), (sd_lo, sd_hi) = stats.channel_mean, stats.channel_std
    bulk_mean = (dim * stats.mean - mu_lo - mu_hi) / (dim - 2)
    std_part = (sd_hi**2 + (dim - 1) * sd_lo**2) / dim
    mean_part = (
        (mu_lo - stats.mean) ** 2
        + (mu_hi - stats.mean) ** 2
        + (dim - 2) * (bulk_mean - stats.mean) ** 2
    ) / dim
    return std_part + mean_part


def _smallest_width(stats: FeatureStatistics) -> int:
    dim = 4
    while _minimum_variance(stats, dim) > stats.std**2:
        dim *= 2
    low = dim // 2
    while low + 1 < dim:  # bisect: the minimum variance decreases with the width
        mid = (low + dim) // 2
        if _minimum_variance(stats, mid) > stats.std**2:
            low = mid
        else:
            dim = mid
    return dim


def channel_targets(stats: FeatureStatistics, dim: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """Per-channel target means and standard deviations with exactly ``stats`` (step 3 above).

    Channel 0 has the largest std and channel 1 the smallest; channels 2 and 3 have the
    smallest and largest mean. The others get ``sigma_c^2 = sd_min^2 + lam * w_c`` and
    ``mu_c = m0 + tau * (g_c - mean(g))`` with seeded ``w ~ U(0, 1)``, ``g ~ U(-1, 1)``;
    ``m0`` fixes the global mean, and ``lam``, ``tau`` take half each of the variance left
    over by the extremes, so the global std is exact.

    Returns:
        ``(mu [dim], sigma [dim])`` in float64.

    Raises:
        ValueError: when ``dim`` channels cannot hold the extremes within the global std
            (a channel with mean 31 weighs 31^2 / dim in the global variance), naming the
            smallest width that can, or when the spread would leave the table's range.
    """
    if dim < 5:
        raise ValueError(f"dim must be at least 5 to hold the four extreme channels, got {dim}")
    spare = stats.std**2 - _minimum_variance(stats, dim)
    if spare < 0:
        raise ValueError(
            f"dim={dim} channels cannot have these statistics: the extreme channels alone "
            f"exceed the global std {stats.std}; use dim >= {_smallest_width(stats)}"
        )
    (mu_lo, mu_hi), (sd_lo, sd_hi) = stats.channel_mean, stats.channel_std
    generator = torch.Generator().manual_seed(seed)
    w = torch.rand(dim - 2, generator=generator, dtype=torch.float64, device="cpu")
    g = torch.rand(dim - 2, generator=generator, dtype=torch.float64, device="cpu") * 2 - 1
    g = g - g.mean()
    lam = 0.5 * spare * dim / w.sum()
    tau = math.sqrt(0.5 * spare * dim / (g * g).sum())

    sigma = torch.empty(dim, dtype=torch.float64)
    sigma[0], sigma[1] = sd_hi, sd_lo
    sigma[2:] = (sd_lo**2 + lam * w).sqrt()

    mu = torch.empty(dim, dtype=torch.float64)
    bulk = [c for c in range(dim) if c not in (2, 3)]
    mu[2], mu[3] = mu_lo, mu_hi
    mu[bulk] = (dim * stats.mean - mu_lo - mu_hi) / (dim - 2) + tau * g

    if sigma.max() > sd_hi or mu.min() < mu_lo or mu.max() > mu_hi:
        raise ValueError(
            f"dim={dim}: spreading the remaining variance over the other channels would leave "
            f"the range of channel_std {stats.channel_std} or channel_mean {stats.channel_mean}; "
            "use a smaller dim"
        )
    return mu, sigma


def calibration_views(images: str, side: int, views: int, seed: int) -> Tensor:
    """The calibration crops ``[views * n_images, 3, side, side]`` uint8 (step 1 above).

    Every image of the folder as a center crop, then ``views - 1`` rounds of seeded
    random-resized crops (the training crops' scale range); the global RNG is left untouched.
    Made once per process for the same files (paths and modification times), side, views and
    seed: a config's rescaled teachers of one resolution share them (a copy each).
    """
    paths = list_images(resolve_image_root(images))
    files = tuple((str(path), path.stat().st_mtime_ns) for path in paths)
    return _calibration_views(files, side, views, seed).clone()


@functools.lru_cache(maxsize=4)
def _calibration_views(
    files: tuple[tuple[str, int], ...], side: int, views: int, seed: int
) -> Tensor:
    center, random_crop = eval_transform(side), train_transform(side)
    photos = [load_rgb(path) for path, _ in files]
    with torch.random.fork_rng(devices=[]):
        torch.random.default_generator.manual_seed(seed)
        crops = [center(p) for p in photos]
        crops += [random_crop(p) for _ in range(views - 1) for p in photos]
    return torch.stack(crops)


@torch.no_grad()
def calibration_features(teacher: Teacher, images: str, views: int, seed: int) -> Tensor:
    """``teacher``'s features ``[N, C]`` (float64, one row per token, on the teacher's device)
    on the calibration views (:func:`calibration_views` at its native resolution).

    The crops are made on the host and the teacher runs where its weights are, whatever the
    default device: a config built under ``torch.device("cuda")`` (benchmarks/harness.py)
    holds teachers on the GPU and teachers that their library moved back to the host
    (open_clip's ``create_model``)."""
    tensors = itertools.chain(teacher.parameters(), teacher.buffers())
    device = next((t.device for t in tensors), torch.device("cpu"))
    with torch.device("cpu"):
        crops = calibration_views(images, teacher.resolution, views, seed)
    with torch.device(device):
        features = teacher(as_float_images(crops.to(device))).features
    return features.reshape(-1, features.shape[-1]).double()


def _mixing(dim: int, inner_dim: int, generator: torch.Generator) -> Tensor:
    """``P [dim, inner_dim]`` with orthonormal columns (``dim >= inner_dim``) or rows."""
    gaussian = torch.randn(
        max(dim, inner_dim), min(dim, inner_dim), generator=generator, device="cpu"
    )
    q, _ = torch.linalg.qr(gaussian.double())
    return q if dim >= inner_dim else q.T


class RescaledTeacher(Teacher):
    """A teacher whose features are affinely mapped to a real teacher's statistics.

    ``features = inner.features @ A.T + b`` with ``A [dim, C_in]``, ``b [dim]`` fixed at
    construction (module docstring); the summary is the inner teacher's. Resolution, patch
    size and pixel normalization are the inner teacher's.

    Args:
        teacher: the inner teacher (e.g. a tiny random-weight one).
        statistics: target statistics: a preset of PHI-S table 7 (``"dfn_clip"``,
            ``"siglip"``, ``"dinov2"``, ``"sam"``) or explicit :class:`FeatureStatistics`.
        dim: feature width ``C`` of the wrapped teacher; default the inner teacher's. The
            table's extremes need enough channels: e.g. at least 93 for DFN CLIP, 462 for
            SigLIP, 29 for DINOv2 and 235 for SAM (the error says so).
        seed: seed of the mixing matrix, of the target channel statistics and of the
            calibration crops.
        calibration_images: folder of calibration images (``"radio_lit:sample_images"``: the
            photographs shipped with the package).
        calibration_views: views per calibration image: a center crop plus
            ``calibration_views - 1`` seeded random-resized crops.
    """

    def __init__(
        self,
        teacher: Teacher,
        statistics: Preset | FeatureStatistics,
        dim: int | None = None,
        seed: int = 0,
        calibration_images: str = SAMPLE_IMAGES,
        calibration_views: int = 8,
    ) -> None:
        super().__init__(teacher.resolution, teacher.patch_size, teacher.mean, teacher.std)
        if isinstance(statistics, str):
            if statistics not in TABLE7:
                raise ValueError(
                    f"statistics: unknown preset {statistics!r}; use one of {sorted(TABLE7)} "
                    "or give FeatureStatistics"
                )
            statistics = TABLE7[statistics]
        if calibration_views < 1:
            raise ValueError(f"calibration_views must be at least 1, got {calibration_views}")
        self.teacher = teacher
        self.statistics = statistics
        self._dim = teacher.feature_dim if dim is None else dim
        mu, sigma = channel_targets(statistics, self._dim, seed)

        inner = calibration_features(teacher, calibration_images, calibration_views, seed)
        m, s = inner.mean(0), inner.std(0, correction=0)
        s = s.clamp_min(1e-6 * s.max())  # a dead inner channel gets no infinite weight
        mixing = _mixing(self._dim, teacher.feature_dim, torch.Generator().manual_seed(seed))
        mixed = ((inner - m) / s) @ mixing.T
        r = mixed.std(0, correction=0)
        if r.min() <= 1e-9 * r.max():
            raise ValueError(
                "the inner teacher's calibration features are degenerate (a mixed channel has "
                "no variance); use more calibration_views or another seed"
            )
        weight = (sigma / r)[:, None] * mixing / s[None]
        self.register_buffer("weight", weight.float(), persistent=False)  # A [dim, C_in]
        self.register_buffer("bias", (mu - weight @ m).float(), persistent=False)  # b [dim]
        self.freeze()

    @property
    def feature_dim(self) -> int:
        return self._dim

    @property
    def summary_dim(self) -> int | None:
        return self.teacher.summary_dim

    @property
    def grid_size(self) -> tuple[int, int]:
        return self.teacher.grid_size

    def encode(self, view: Tensor) -> TeacherOutput:
        """``[B, 3, R, R]`` -> the inner summary, features ``[B, H, W, dim]`` rescaled."""
        out = self.teacher.run_encoder(view)
        features = out.features.float() @ self.weight.T + self.bias
        return TeacherOutput(summary=out.summary, features=features)
