"""benchmarks/featsharp.py at a tiny size: its teacher kinds are what it says (the output is
the truth pooled, times a gain, plus the pattern; a global-context term the same at every
token; high-norm tokens where the pattern has them), its overlay on
configs/featsharp/quickstart.yaml swaps only what the benchmark says, and one short cell,
trained through ``radio-lit fit`` and loaded through ``UpsampledTeacher``, prints its
documented line and record, with FeatSharp below bilinear and the tiles and most of a
structured pattern removed (the pre-pass's shrunk start)."""

import re

import pytest
import torch

from benchmarks import featsharp
from benchmarks.featsharp import KINDS, Cell, FieldTeacher, overlay, read, table
from radio_lit.data.views import resize_view

LINE = re.compile(
    r"cell ([\w-]+): error to truth: bilinear (\d+\.\d+), tiles (\d+\.\d+), "
    r"featsharp (\d+\.\d+); pattern removed (-?\d+\.\d+|nan)%"
)


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_teacher_output_is_its_truth_pooled_times_the_gain_plus_the_pattern(kind):
    teacher = FieldTeacher(calibration_images=2, **KINDS[kind])
    images = torch.rand(2, 3, 144, 144)
    truth = teacher.truth(images)
    low = teacher(resize_view(images, 48), (48, 48))  # the low-resolution pass's view
    pooled = torch.nn.functional.avg_pool2d(truth.permute(0, 3, 1, 2), 3).permute(0, 2, 3, 1)
    assert truth.shape == (2, 12, 12, 32)
    pattern, gain = teacher.pattern, teacher.gain
    assert torch.allclose(low.features, pooled * gain + pattern, atol=1e-5)
    assert pattern.mean((0, 1)).abs().max() < 1e-5  # zero-mean per channel: position-locked
    view = teacher.view(resize_view(images, 48))
    context = truth - teacher.model(view).permute(0, 2, 3, 1)  # G: one vector per image
    if KINDS[kind]["context"]:
        assert torch.allclose(context, context[:, :1, :1].expand_as(context), atol=1e-5)
        assert not torch.allclose(context[0], context[1], atol=1e-3)
    else:
        assert float(context.abs().max()) == 0.0
    norms = pattern.norm(dim=-1).flatten()
    name = KINDS[kind]["pattern"]
    if name in ("structured", "few", "registers", "leakage"):  # high-norm tokens
        assert float(norms.max()) > 3 * float(norms.median())
    if name in ("none", "gain"):
        assert float(norms.max()) == 0.0
    assert (float((gain - 1).abs().max()) > 0.1) == (name == "gain")


def test_the_overlay_swaps_only_the_teacher_images_factor_steps_seed_and_pre_pass(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(featsharp, "TRAIN_IMAGES", 3)
    monkeypatch.setattr(featsharp, "EVAL_IMAGES", 2)
    cell = Cell(kind="sky", seed=1, grid=2, factor=2, steps=90, prepass=0)
    swapped = overlay(cell, tmp_path)
    model = swapped["model"]["init_args"]
    assert set(swapped) == {"seed_everything", "trainer", "model", "data"}
    assert swapped["trainer"] == {"max_steps": 90} and swapped["seed_everything"] == 1
    assert set(model) == {"teacher", "upsampler", "bias_from_statistics"}
    assert model["upsampler"] == {"init_args": {"factor": 2}}
    assert model["teacher"]["init_args"]["resolution"] == 24 and not model["bias_from_statistics"]
    data = swapped["data"]["init_args"]
    assert set(data) == {"train_dir", "val_dir", "crop_size"} and data["crop_size"] == 48
    assert len(list((tmp_path / "train").glob("*.png"))) == 3
    assert len(list((tmp_path / "held-out").glob("*.png"))) == 2
    longer = overlay(Cell(grid=2, prepass=100), tmp_path / "b")["model"]["init_args"]
    assert longer["statistics_batches"] == 100 and "bias_from_statistics" not in longer


def test_a_short_cell_through_radio_lit_fit_beats_bilinear_and_removes_the_pattern(
    tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(featsharp, "TRAIN_IMAGES", 8)
    monkeypatch.setattr(featsharp, "EVAL_IMAGES", 8)
    out = tmp_path / "results.jsonl"
    record = featsharp.main(["cell", "--kind=shapes", "--steps=30", f"--out={out}"])[0]
    lines = capsys.readouterr().out.strip().splitlines()
    match = LINE.fullmatch(lines[-1])
    assert match and match[1] == Cell(steps=30).name, lines[-1]
    assert abs(float(match[4]) - record["featsharp"]) < 1e-4
    assert read(out) == [record]
    # the bias starts at the pre-pass's shrunk position-locked mean: most of the structured
    # pattern and its high-norm token are gone at once, and the map is below bilinear's
    assert record["featsharp"] < min(record["bilinear"], record["tiles"])
    assert record["removed"] > 50
    assert table([record]).splitlines()[-1] == (
        "featsharp below bilinear and tiles on 1 of 1 cells; pattern removed > 50 % on 1 of 1"
    )
