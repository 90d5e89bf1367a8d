"""``radio-lit predict`` as a user meets it: features written from an export or a checkpoint,
read back with safetensors, equal to ``radio_lit.load``'s outputs."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path

import pytest
import torch
import webdataset as wds
import yaml
from PIL import Image
from safetensors.torch import load_file
from torchvision.transforms.v2 import functional as TF

import radio_lit
from radio_lit.cli.app import main
from radio_lit.cli.predict import read_predictions
from radio_lit.data.image_folder import sample_images_dir
from radio_lit.export import module_inference_model, save_safetensors
from tests.builders import tiny_module, tiny_student
from tests.export.tiny_export import STUDENT, TEACHERS
from tests.teachers.tiny import tiny_clip_teacher, tiny_dinov2_teacher, tiny_sam_teacher

PHOTOS = ["astronaut.jpg", "camera.jpg", "chelsea.jpg", "coffee.jpg", "rocket.jpg"]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> dict[str, Path]:
    """A tiny run: checkpoint and config.yaml, its safetensors export, a folder of photos
    (one in a subfolder, one unreadable file) and a webdataset shard of the same photos."""
    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("predict")
    module = tiny_module(
        student=tiny_student(**STUDENT["init_args"]),
        teachers={
            "clip": tiny_clip_teacher(),
            "dino": tiny_dinov2_teacher(),
            "sam": tiny_sam_teacher(resolution=64),
        },
    )
    checkpoint = root / "version_0" / "checkpoints" / "last.ckpt"
    checkpoint.parent.mkdir(parents=True)
    torch.save({"state_dict": module.state_dict()}, checkpoint)
    config = {"model": {"student": STUDENT, "teachers": TEACHERS, "student_resolution": 64}}
    (root / "version_0" / "config.yaml").write_text(yaml.safe_dump(config))
    exported, _ = save_safetensors(module_inference_model(module), root / "export" / "last")
    images = root / "images"
    (images / "sub").mkdir(parents=True)
    for i, name in enumerate(PHOTOS):
        shutil.copy(sample_images_dir() / name, images / ("sub" if i == 2 else "") / name)
    (images / "broken.jpg").write_bytes(b"not an image")
    shards = root / "shards"
    shards.mkdir()
    with wds.TarWriter(str(shards / "00000.tar")) as tar:
        for name in PHOTOS:
            photo = sample_images_dir() / name
            tar.write({"__key__": Path(name).stem, "jpg": photo.read_bytes()})
    return {"ckpt": checkpoint, "export": exported, "images": images, "shards": shards}


def expected_outputs(path: Path, files: list[Path], size: tuple[int, int]) -> dict:
    """``radio_lit.load(path)`` on the photos resized to ``size`` (antialiased bilinear)."""
    batch = torch.stack(
        [
            TF.resize(TF.pil_to_tensor(Image.open(f).convert("RGB")), list(size), antialias=True)
            for f in files
        ]
    )
    with torch.no_grad():
        return radio_lit.load(path)(batch.float() / 255)


def test_predict_from_an_export_writes_what_load_computes(run, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "features"
    main(
        [
            "predict",
            "--model_path",
            str(run["export"]),
            "--images",
            str(run["images"]),
            "--output",
            str(out),
            "--batch_size",
            "2",
            "--images_per_shard",
            "3",
        ]
    )
    assert "5 images -> 2 shard(s)" in capsys.readouterr().out
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["resolution"] == [64, 64]  # the export's preferred resolution
    assert manifest["skipped"] == ["broken.jpg"]
    names = [n for shard in manifest["shards"] for n in shard["images"]]
    assert names == ["astronaut.jpg", "camera.jpg", "coffee.jpg", "rocket.jpg", "sub/chelsea.jpg"]
    # Read back as a user would: safetensors files named by the manifest.
    shards = [load_file(str(out / shard["file"])) for shard in manifest["shards"]]
    assert [len(s["backbone/summary"]) for s in shards] == [3, 2]
    modes = {stat.S_IMODE((out / s["file"]).stat().st_mode) for s in manifest["shards"]}
    assert modes == {stat.S_IMODE((out / "manifest.json").stat().st_mode)}  # the umask's
    stored = {k: torch.cat([s[k] for s in shards]) for k in shards[0]}
    files = [run["images"] / n for n in names]
    expected = expected_outputs(run["export"], files, (64, 64))
    assert "sam/summary" not in stored  # SAM has no summary
    assert set(stored) == {f"{o}/features" for o in expected} | {
        f"{o}/summary" for o in expected if expected[o].summary is not None
    }
    for name, output in expected.items():
        torch.testing.assert_close(stored[f"{name}/features"], output.features)
        assert stored[f"{name}/features"].shape[1:3] == (4, 4)
        if output.summary is not None:
            torch.testing.assert_close(stored[f"{name}/summary"], output.summary)
    assert list(tmp_path.iterdir()) == [out]  # nothing else written (no lightning_logs)


def test_predict_from_a_checkpoint_over_shards_at_a_given_resolution(run, tmp_path):
    out = tmp_path / "features"
    main(
        [
            "predict",
            "--ckpt_path",
            str(run["ckpt"]),
            "--shards",
            str(run["shards"] / "{00000..00000}.tar"),
            "--output",
            str(out),
            "--resolution",
            "40",
            "72",
            "--pad",
            "--dtype",
            "float16",
        ]
    )
    names, stored = read_predictions(out)
    assert names == [f"00000.tar/{Path(n).stem}" for n in PHOTOS]
    files = [next(run["images"].rglob(n)) for n in PHOTOS]
    batch = torch.stack(
        [
            TF.resize(TF.pil_to_tensor(Image.open(f).convert("RGB")), [40, 72], antialias=True)
            for f in files
        ]
    )
    with torch.no_grad():
        expected = radio_lit.load(run["ckpt"], pad=True)(batch.float() / 255)
    features = stored["dino/features"]
    assert features.dtype == torch.float16 and features.shape[1:3] == (3, 5)  # 40x72 padded
    torch.testing.assert_close(features.float(), expected["dino"].features, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--resolution", "70"], "not a multiple of the patch size 16"),
        (["--batch_size", "0"], "--batch_size must be positive"),
        (["--batch_sz", "4"], "did you mean '--batch_size'"),
        (["--device", "gpu"], "--device 'gpu': not a device; give cpu, cuda or cuda:N"),
        # one CUDA device more than this machine has: none on a CPU, cuda:N on a GPU machine
        (["--device", f"cuda:{torch.cuda.device_count()}"], "CUDA device"),
    ],
)
def test_bad_predict_arguments_get_one_line(run, tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as stopped:
        main(
            ["predict", "--model_path", str(run["export"]), "--images", str(run["images"])]
            + ["--output", str(tmp_path / "out"), *args]
        )
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("radio-lit: error:") and message in err, err


def test_a_non_empty_output_is_kept_until_overwrite(run, tmp_path, capsys):
    """A second prediction into the same folder is refused in one line naming --overwrite,
    the first's shards untouched; with it, the earlier shards go and the new manifest's stay."""
    out = tmp_path / "features"
    predict = ["predict", "--model_path", str(run["export"]), "--output", str(out)]
    main([*predict, "--images", str(run["images"]), "--images_per_shard", "1"])
    first = json.loads((out / "manifest.json").read_text())
    assert len(first["shards"]) == 5
    (out / "notes.txt").write_text("mine\n")
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        main([*predict, "--shards", str(run["shards"] / "00000.tar")])
    assert stopped.value.code == 2
    error = capsys.readouterr().err.splitlines()[0]
    assert error.startswith(f"radio-lit: error: radio-lit predict: {out} is not empty (")
    assert "give --overwrite" in error
    assert json.loads((out / "manifest.json").read_text()) == first
    main([*predict, "--shards", str(run["shards"] / "00000.tar"), "--overwrite"])
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "notes.txt",
        "shard-00000.safetensors",
    ]
    names, _ = read_predictions(out)
    assert names == [f"00000.tar/{Path(n).stem}" for n in PHOTOS]
