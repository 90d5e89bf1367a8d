"""benchmarks/featsharp.py at a tiny size: it trains the quickstart's FeatSharp on its
known-truth teacher through radio-lit's CLI, ends with the documented line, and FeatSharp's
error to the truth is below bilinear upsampling's."""

import re

import torch

from benchmarks.featsharp import FieldTeacher, main
from radio_lit.data.views import resize_view

LINE = re.compile(
    r"error to truth: bilinear (\d+\.\d+), tiles (\d+\.\d+), featsharp (\d+\.\d+); "
    r"pattern removed (-?\d+\.\d+)%"
)


def test_the_teacher_output_is_its_truth_pooled_plus_the_pattern():
    teacher = FieldTeacher(calibration_images=2)
    images = torch.rand(2, 3, 144, 144)
    truth = teacher.truth(images)
    low = teacher(resize_view(images, 48), (48, 48))  # the low-resolution pass's view
    pooled = torch.nn.functional.avg_pool2d(truth.permute(0, 3, 1, 2), 3).permute(0, 2, 3, 1)
    assert truth.shape == (2, 12, 12, 32)
    pattern = teacher.pattern
    assert torch.allclose(low.features - pooled, pattern.expand_as(pooled), atol=1e-5)
    assert pattern.mean((0, 1)).abs().max() < 1e-5  # zero-mean per channel: position-locked


def test_featsharp_benchmark_ends_with_its_line_and_beats_bilinear(capsys):
    result = main(["--steps=8", "--batch=2", "--eval-images=4", "--threads=1"])
    last = capsys.readouterr().out.strip().splitlines()[-1]
    match = LINE.fullmatch(last)
    assert match, last
    bilinear, tiles, featsharp, removed = map(float, match.groups())
    assert featsharp < bilinear
    assert abs(featsharp - result["featsharp"]) < 1e-4 and abs(removed - result["removed"]) < 0.1
