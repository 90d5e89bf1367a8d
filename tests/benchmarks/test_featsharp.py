"""benchmarks/featsharp.py at a tiny size: its teacher kinds are what it says (the output is
the truth pooled plus the pattern; a global-context term the same at every token; a structured
pattern with one high-norm token), it trains the quickstart's FeatSharp on them through
radio-lit's CLI, prints one documented line per run and the summary last, on its own kind
FeatSharp's error to the truth is below bilinear upsampling's, and the bias started from the
pre-pass removes most of a structured pattern at once."""

import re

import pytest
import torch

from benchmarks.featsharp import KINDS, FieldTeacher, main
from radio_lit.data.views import resize_view

LINE = re.compile(
    r"kind (\w+), seed (\d+): error to truth: bilinear (\d+\.\d+), tiles (\d+\.\d+), "
    r"featsharp (\d+\.\d+); pattern removed (-?\d+\.\d+)%"
)
SUMMARY = re.compile(
    r"featsharp below bilinear and tiles on (\d+) of (\d+) runs; "
    r"pattern removed > 50 % on (\d+) of (\d+)"
)


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_teacher_output_is_its_truth_pooled_plus_the_pattern(kind):
    teacher = FieldTeacher(calibration_images=2, **KINDS[kind])
    images = torch.rand(2, 3, 144, 144)
    truth = teacher.truth(images)
    low = teacher(resize_view(images, 48), (48, 48))  # the low-resolution pass's view
    pooled = torch.nn.functional.avg_pool2d(truth.permute(0, 3, 1, 2), 3).permute(0, 2, 3, 1)
    assert truth.shape == (2, 12, 12, 32)
    pattern = teacher.pattern
    assert torch.allclose(low.features - pooled, pattern.expand_as(pooled), atol=1e-5)
    assert pattern.mean((0, 1)).abs().max() < 1e-5  # zero-mean per channel: position-locked
    view = teacher.view(resize_view(images, 48))
    context = truth - teacher.model(view).permute(0, 2, 3, 1)  # G: one vector per image
    if KINDS[kind]["context"]:
        assert torch.allclose(context, context[:, :1, :1].expand_as(context), atol=1e-5)
        assert not torch.allclose(context[0], context[1], atol=1e-3)
    else:
        assert float(context.abs().max()) == 0.0
    norms = pattern.norm(dim=-1).flatten()
    if KINDS[kind]["pattern"] == "structured":  # one high-norm token
        assert float(norms.max()) > 3 * float(norms.median())


def test_featsharp_benchmark_prints_its_lines_and_beats_bilinear_on_its_own_kind(capsys):
    argv = ["--kinds", "field", "shapes", "--seeds", "0", "--steps=8", "--batch=2"]
    results = main([*argv, "--eval-images=4", "--threads=1", "--statistics-batches=8"])
    lines = capsys.readouterr().out.strip().splitlines()
    runs = [m for m in map(LINE.fullmatch, lines) if m]
    assert [(m[1], int(m[2])) for m in runs] == [("field", 0), ("shapes", 0)]
    summary = SUMMARY.fullmatch(lines[-1])
    assert summary and summary[2] == summary[4] == "2", lines[-1]
    for match in runs:
        kind, seed, bilinear, tiles, featsharp, removed = match.groups()
        result = results[(kind, int(seed))]
        assert abs(float(featsharp) - result["featsharp"]) < 1e-4
        assert abs(float(removed) - result["removed"]) < 0.1
    field = results[("field", 0)]
    assert field["featsharp"] < field["bilinear"]
    # the bias starts at the pre-pass's position-locked mean: most of the structured pattern
    # and its high-norm token are gone before training has moved it far
    assert results[("shapes", 0)]["removed"] > 50
