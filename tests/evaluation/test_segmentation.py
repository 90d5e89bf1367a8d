"""Linear-probe segmentation: a probe on real features far above a constant predictor, the
mIoU of a hand-checked case, ADE20k's folder layout, the mmseg protocol's pieces."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from PIL import Image

from radio_lit.data.views import normalize_view
from radio_lit.evaluation import (
    ModelView,
    SampleSegmentation,
    SegmentationFolder,
    SegmentationProbe,
    miou_metric,
    write_segmentation_folder,
)
from radio_lit.evaluation.segmentation import _warmup_poly
from radio_lit.evaluation.segmentation_data import (
    IGNORE,
    random_scale_crop,
    shift_labels,
    window_starts,
)
from radio_lit.teachers import TeacherOutput
from tests.builders import tiny_student
from tests.distributed.gloo import run_gloo_workers

WORKER = Path(__file__).with_name("segmentation_worker.py")


def student_view() -> ModelView:
    """The tiny CPE ViT student (random weights: real, untrained features) at 64 px."""
    torch.manual_seed(0)
    student = tiny_student().eval()

    def model(images: torch.Tensor) -> dict[str, TeacherOutput]:
        out = student(normalize_view(images, student.pixel_mean, student.pixel_std))
        return {"backbone": TeacherOutput(out.summary[:, 0], out.features)}

    return ModelView(model, (64, 64), 16)


def test_miou_of_a_hand_checked_case() -> None:
    """ADE20k labels (0 ignored, 1..K): per class IoU = |P & L| / |P | L| summed over images,
    averaged over the classes present in prediction or labels."""
    labels = torch.tensor([[[1, 1, 2, 0]], [[3, 3, 3, 2]]])  # ADE values; the 0 is ignored
    predictions = torch.tensor([[[0, 1, 1, 2]], [[2, 2, 0, 1]]])  # class indices 0..3
    # (image 0's last pixel is ignored, its prediction 2 with it)
    # class 0 (ADE 1): labelled {0:0, 0:1}, predicted {0:0, 1:2} -> I = 1, U = 3
    # class 1 (ADE 2): labelled {0:2, 1:3}, predicted {0:1, 0:2, 1:3} -> I = 2, U = 3
    # class 2 (ADE 3): labelled {1:0, 1:1, 1:2}, predicted {1:0, 1:1} -> I = 2, U = 3
    # class 3: neither predicted nor labelled -> left out of the mean
    metric = miou_metric(4)
    metric.update(predictions, shift_labels(labels))
    assert float(metric.compute()) == pytest.approx((1 / 3 + 2 / 3 + 2 / 3) / 3)


def test_probe_on_real_features_beats_a_constant_predictor_widely() -> None:
    probe = SegmentationProbe(
        num_classes=10,
        resolutions=[64],
        steps=40,
        warmup_steps=0,
        batch_size=8,
        lr=1e-2,
        sample_count=16,
    )
    with torch.no_grad():
        report = probe.evaluate(student_view())
    miou = report.scalars["eval/segmentation/backbone/miou_64"]
    validation = SampleSegmentation("validation", 16)
    labels = torch.stack([shift_labels(validation[i][1]) for i in range(16)])
    constants = []
    for c in range(10):
        metric = miou_metric(10)
        metric.update(torch.full_like(labels, c), labels)
        constants.append(100 * float(metric.compute()))
    assert max(constants) < 2.0
    assert miou > 8 * max(constants), (miou, constants)


def test_the_sample_set_in_ade20k_layout_reads_back(tmp_path: Path) -> None:
    sample = SampleSegmentation("validation", 2)
    root = write_segmentation_folder(sample, tmp_path / "ade", "validation")
    folder = SegmentationFolder(root, "validation")
    assert len(folder) == 2
    image, labels = folder[1]
    expected_image, expected_labels = sample[1]
    assert torch.equal(labels, expected_labels)  # PNG: exact
    assert (image.float() - expected_image.float()).abs().mean() < 4  # JPEG
    assert set(labels.unique().tolist()) <= set(range(11)) and (labels == 0).any()
    (root / "annotations" / "validation" / "validation_00000.png").unlink()
    with pytest.raises(FileNotFoundError, match="needs annotations/validation/<name>.png"):
        SegmentationFolder(root, "validation")
    with pytest.raises(FileNotFoundError, match="ADE20k's layout"):
        SegmentationFolder(root, "training")


def test_training_crops_and_sliding_windows_follow_mmseg() -> None:
    image = torch.randint(0, 256, (3, 40, 60), dtype=torch.uint8)
    labels = shift_labels(torch.randint(0, 5, (40, 60)))
    generator = torch.Generator().manual_seed(0)
    for _ in range(5):
        crop, crop_labels = random_scale_crop(image, labels, 32, generator)
        assert crop.shape == (3, 32, 32) and crop_labels.shape == (32, 32)
        assert crop.max() <= 1 and set(crop_labels.unique().tolist()) <= {IGNORE, 0, 1, 2, 3}
    assert window_starts(64, 64, 43) == [0]
    assert window_starts(100, 64, 43) == [0, 36]  # the last window ends at the border
    assert window_starts(200, 64, 43) == [0, 43, 86, 129, 136]


def test_schedule_is_linear_warmup_then_poly_decay() -> None:
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
    schedule = _warmup_poly(optimizer, warmup=10, steps=110)
    rates = []
    for _ in range(110):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert rates[0] == pytest.approx(1e-9)  # start_factor 1e-6
    assert rates[10] == pytest.approx(1e-3)
    assert rates[60] == pytest.approx(0.5e-3)  # halfway through the decay
    assert optimizer.param_groups[0]["lr"] == pytest.approx(0.0)


def test_bad_probe_settings_are_one_line() -> None:
    with pytest.raises(ValueError, match="warmup_steps < steps"):
        SegmentationProbe(steps=10, warmup_steps=10)
    probe = SegmentationProbe(num_classes=10, resolutions=[72], steps=1, warmup_steps=0)
    with pytest.raises(ValueError, match="not a multiple of the student's patch size 16"):
        probe.evaluate(student_view())
    probe = SegmentationProbe(num_classes=5, resolutions=[32], steps=1, warmup_steps=0)
    with pytest.raises(ValueError, match=r"label \d+, above num_classes=5"):
        probe.evaluate(student_view())  # the sample set has 10 classes


def test_two_gloo_ranks_train_one_head_and_run_as_many_forwards(tmp_path: Path) -> None:
    """Each rank draws its own crops; the averaged gradients and BatchNorm statistics leave
    one head on both, and a rank with smaller validation images pads its forwards to the
    other's (collective under FSDP: unequal counts would hang)."""
    root = write_segmentation_folder(SampleSegmentation("training", 4), tmp_path, "training")
    (root / "images" / "validation").mkdir(parents=True)
    (root / "annotations" / "validation").mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    for i, (height, width) in enumerate([(32, 32), (32, 96), (48, 32)]):
        image = torch.randint(0, 256, (height, width, 3), generator=generator, dtype=torch.uint8)
        labels = torch.randint(0, 11, (height, width), generator=generator, dtype=torch.uint8)
        Image.fromarray(image.numpy()).save(root / "images" / "validation" / f"{i}.jpg")
        Image.fromarray(labels.numpy()).save(root / "annotations" / "validation" / f"{i}.png")
    first, second = run_gloo_workers(WORKER, tmp_path, str(root))
    for key, value in first["head"].items():
        torch.testing.assert_close(second["head"][key], value, rtol=0, atol=0)
    assert first["score"] == second["score"]
    # rank 0: images 0 and 2 (1 + 2 windows), rank 1: image 1 twice (5 + 5): both run 3 + 10
    assert first["calls"] == second["calls"] == 3 + 10


def test_probe_trains_under_inference_mode() -> None:
    """radio-lit validate / test run the measures under torch.inference_mode."""
    probe = SegmentationProbe(
        num_classes=10, resolutions=[32], steps=2, warmup_steps=0, batch_size=2, sample_count=2
    )
    with torch.inference_mode():
        report = probe.evaluate(student_view())
    assert 0 <= report.scalars["eval/segmentation/backbone/miou_32"] <= 100
