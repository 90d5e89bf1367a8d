"""Synthetic labeled folders and model views with known answers, for the evaluation tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import Tensor, nn

from radio_lit.evaluation import ModelView
from radio_lit.teachers import TeacherOutput


def write_color_classes(
    root: Path, colors: dict[str, tuple[int, int, int]], per_class: int, noise: float, seed: int
) -> Path:
    """``root/<class>/<i>.png``: 16x16 images of the class colour plus uniform pixel noise
    (``±noise`` on a 0-255 scale), drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    for name, color in colors.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            shift = rng.uniform(-noise, noise, size=3)  # one colour shift per image
            pixels = np.clip(np.array(color) + shift, 0, 255)[None, None] * np.ones((16, 16, 1))
            Image.fromarray(pixels.astype(np.uint8)).save(root / name / f"{i}.png")
    return root


class MeanColor(nn.Module):
    """A "student" whose summary is the image's mean colour (centered at grey) and whose
    patch features are that colour on a ``resolution / 16`` grid."""

    def forward(self, images: Tensor) -> dict[str, TeacherOutput]:
        color = images.mean(dim=(2, 3)) - 0.5  # [B, 3]
        h, w = images.shape[2] // 16, images.shape[3] // 16
        features = color[:, None, None, :].expand(-1, h, w, -1)
        return {"backbone": TeacherOutput(summary=color, features=features)}


def mean_color_view(resolution: int = 32) -> ModelView:
    return ModelView(MeanColor(), (resolution, resolution), 16)


def dataset_root(tmp: Path, seed: int = 0, noise: float = 10.0) -> tuple[Path, Path]:
    """Train and eval folders of three well-separated colour classes."""
    colors = {"red": (200, 30, 30), "green": (30, 200, 30), "blue": (30, 30, 200)}
    train = write_color_classes(tmp / "train", colors, 6, noise, seed)
    evaluation = write_color_classes(tmp / "eval", colors, 4, noise, seed + 1)
    return train, evaluation


def overlapping_root(tmp: Path) -> tuple[Path, Path]:
    """Train and eval folders of four classes whose colours overlap (accuracy well below 100%)."""
    colors = {
        "a": (148, 128, 128),
        "b": (128, 148, 128),
        "c": (128, 128, 148),
        "d": (108, 108, 108),
    }
    train = write_color_classes(tmp / "train", colors, 12, 30.0, 2)
    evaluation = write_color_classes(tmp / "eval", colors, 9, 30.0, 3)
    return train, evaluation


def image_tensor(seed: int, count: int = 4, size: int = 16) -> Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(count, 3, size, size, generator=generator)
