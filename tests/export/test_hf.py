"""``radio-lit export --format hf``: a folder that transformers' ``AutoModel`` and
``radio_lit.load`` (path or Hub id) load to the same outputs, with a card written from the run."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from torch.utils.tensorboard import SummaryWriter
from transformers import AutoImageProcessor, AutoModel

import radio_lit
from radio_lit.cli.app import main
from radio_lit.data.image_folder import sample_images_dir
from radio_lit.export import module_inference_model
from radio_lit.export.card import teacher_source
from radio_lit.export.files import model_file
from radio_lit.hf.folder import save_hf
from tests.export.tiny_export import own_outputs, saved_run

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def hf_run(trained, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A saved run with metrics in its TensorBoard logs, exported with the real command."""
    run = tmp_path_factory.mktemp("run") / "version_0"
    checkpoint = saved_run(trained, run)
    writer = SummaryWriter(str(run))
    for step, value in [(50, 0.2), (100, 0.375)]:
        writer.add_scalar("eval/segmentation/backbone/miou_64", value, step)
        writer.add_scalar("eval/mode_switching/dino/mse/step_2", value, 64)  # a curve point
    writer.add_scalar("val/fidelity_geomean", 1.5, 100)
    writer.add_scalar("train/loss", 3.0, 100)
    writer.close()
    folder = run.parent / "out"
    main(["export", str(checkpoint), "--format", "hf", "--output", str(folder)])
    return checkpoint, folder


def _assert_same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for name in a:
        torch.testing.assert_close(a[name].features, b[name].features, rtol=0, atol=1e-6)
        if a[name].summary is None:
            assert b[name].summary is None
        else:
            torch.testing.assert_close(a[name].summary, b[name].summary, rtol=0, atol=1e-6)


def test_automodel_and_load_give_the_same_outputs(trained, hf_run) -> None:
    checkpoint, folder = hf_run
    assert sorted(p.name for p in folder.iterdir()) == [
        "LICENSE.md",
        "README.md",
        "config.json",
        "model.safetensors",
        "preprocessor_config.json",
        "radio_lit_auto.py",
    ]
    images = torch.rand(2, 3, 48, 80, generator=torch.Generator().manual_seed(3))
    auto = AutoModel.from_pretrained(folder).eval()
    assert next(auto.parameters()).dtype == torch.float32
    with torch.no_grad():
        from_auto, from_load = auto(images), radio_lit.load(folder)(images)
        from_checkpoint = radio_lit.load(checkpoint)(images)
    _assert_same(from_auto, from_load)
    _assert_same(from_load, from_checkpoint)
    own = own_outputs(trained, images)  # the training module's unfolded outputs
    torch.testing.assert_close(from_load["dino"].features, own["dino"][1], rtol=1e-4, atol=1e-4)


def test_automodel_loads_in_a_fresh_process_without_remote_code(hf_run) -> None:
    """`import radio_lit` registers the classes, whichever of it and transformers comes first,
    without importing transformers itself."""
    _, folder = hf_run
    script = (
        "import sys, radio_lit, torch\n"
        "assert 'transformers' not in sys.modules\n"
        "from transformers import AutoModel\n"
        f"model = AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=False)\n"
        "out = model(torch.zeros(1, 3, 32, 32))\n"
        "print(type(model).__name__, sorted(out))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[0] == "RadioLitHFModel ['backbone', 'clip', 'dino', 'sam']"


def test_automodel_without_import_radio_lit_says_what_to_do_and_that_works(
    hf_run, tmp_path: Path
) -> None:
    """Without ``import radio_lit``: not transformers' "update Transformers" (an unknown
    model_type) but a request for ``trust_remote_code=True``, which then loads the model
    through the folder's ``radio_lit_auto.py`` (radio-lit's own classes, imported)."""
    _, folder = hf_run
    script = (
        "import sys, torch\n"
        "from transformers import AutoModel\n"
        "try:\n"
        f"    AutoModel.from_pretrained({str(folder)!r})\n"
        "except ValueError as error:\n"
        "    print('refused:', ' '.join(str(error).split()))\n"
        "assert 'radio_lit' not in sys.modules\n"
        f"model = AutoModel.from_pretrained({str(folder)!r}, trust_remote_code=True)\n"
        "out = model(torch.ones(1, 3, 32, 32))\n"
        "print(type(model).__name__, sorted(out), float(out['dino'].features.sum()))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "OMP_NUM_THREADS": "1",
        "HF_MODULES_CACHE": str(tmp_path / "modules"),
        "HF_HUB_OFFLINE": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    refused, loaded = done.stdout.strip().split("\n")[-2:]
    assert "trust_remote_code=True" in refused and "upgrade" not in refused
    name, rest = loaded.split(" ", 1)
    assert name == "RadioLitHFModel" and "'backbone', 'clip', 'dino', 'sam'" in rest
    with torch.no_grad():
        expected = float(radio_lit.load(folder)(torch.ones(1, 3, 32, 32))["dino"].features.sum())
    assert float(rest.rsplit(" ", 1)[1]) == pytest.approx(expected, rel=1e-5)
    shim = (folder / "radio_lit_auto.py").read_text()
    assert "import radio_lit" in shim and "pip install radio-lit" in shim


def test_preprocessor_config_gives_the_model_its_input(hf_run) -> None:
    _, folder = hf_run
    processor = AutoImageProcessor.from_pretrained(folder)
    photo = (torch.rand(3, 90, 120) * 255).to(torch.uint8)
    pixels = processor(photo, return_tensors="pt")["pixel_values"]
    assert pixels.shape == (1, 3, 64, 64)  # the preferred (training) resolution
    assert float(pixels.min()) >= 0.0 and float(pixels.max()) <= 1.0
    contract = json.loads((folder / "preprocessor_config.json").read_text())["radio_lit"]
    assert contract["patch_size"] == 16 and contract["input_range"] == [0.0, 1.0]
    assert contract["supported_resolutions"]["cpe_max"] == 256


def test_card_names_the_teachers_and_shows_the_run_metrics(hf_run) -> None:
    _, folder = hf_run
    card = (folder / "README.md").read_text()
    _, front, body = card.split("---\n", 2)
    meta = yaml.safe_load(front)
    assert meta["library_name"] == "radio-lit"
    assert meta["pipeline_tag"] == "image-feature-extraction"
    assert meta["license_link"] == "LICENSE.md" and (folder / "LICENSE.md").is_file()
    assert "model-index" not in meta  # the checkpoint records no step: no result is its own
    for teacher in ("| clip | OpenCLIPTeacher |", "| dino | DINOv2Teacher |", "| sam |"):
        assert teacher in body
    name = "linear-probe segmentation mIoU (%) at 64 px (backbone features)"
    assert f"| {name} | 0.375 | 100 |" in body
    assert "step_2" not in card  # curve points are no final metric
    assert "| fidelity, geometric mean over the teachers | 1.5 | 101 |" in body
    assert "train/loss" not in body


def test_card_without_logged_metrics_says_not_evaluated(trained, tmp_path: Path) -> None:
    checkpoint = saved_run(trained, tmp_path / "version_0")
    main(["export", str(checkpoint), "--format", "hf", "--heads", "dino"])
    folder = tmp_path / "version_0" / "export" / "last-hf"
    assert "Not evaluated" in (folder / "README.md").read_text()
    model = radio_lit.load(folder)
    assert model.teacher_names == ["dino"]
    images = torch.rand(1, 3, 64, 64)
    with torch.no_grad():
        torch.testing.assert_close(
            model(images)["dino"].features, radio_lit.load(checkpoint)(images)["dino"].features
        )


def test_an_unknown_head_is_one_line(trained, tmp_path: Path, capsys) -> None:
    checkpoint = saved_run(trained, tmp_path / "version_0")
    with pytest.raises(SystemExit) as stopped:
        main(["export", str(checkpoint), "--format", "hf", "--heads", "siglip"])
    assert stopped.value.code == 2
    assert "--heads: the model has no teacher 'siglip'" in capsys.readouterr().err


def test_a_folder_without_config_json_gets_advice_that_works(trained, tmp_path: Path, capsys):
    """``predict`` / ``evaluate`` on a Hugging Face folder that lost its config.json (or on
    its weights file) say to export it again; doing so makes predict work."""
    checkpoint = saved_run(trained, tmp_path / "version_0")
    folder = tmp_path / "out"
    main(["export", str(checkpoint), "--format", "hf", "--output", str(folder)])
    (folder / "config.json").unlink()
    images = tmp_path / "images"
    images.mkdir()
    shutil.copy(sample_images_dir() / "coffee.jpg", images)
    predict = ["predict", "--images", str(images), "--output", str(tmp_path / "features")]
    advice = f"radio-lit export CHECKPOINT --format hf --output {folder} --overwrite"
    for command in (
        [*predict, "--model_path", str(folder)],
        [*predict, "--model_path", str(folder / "model.safetensors")],
        ["evaluate", "--model_path", str(folder)],
    ):
        capsys.readouterr()
        with pytest.raises(SystemExit) as stopped:
            main(command)
        assert stopped.value.code == 2, command
        error = capsys.readouterr().err.splitlines()[0]
        assert "but no config.json" in error and error.endswith(f"({advice})"), error
    main(["export", str(checkpoint), "--format", "hf", "--output", str(folder), "--overwrite"])
    main([*predict, "--model_path", str(folder)])
    assert (tmp_path / "features" / "manifest.json").is_file()


def test_load_takes_a_hub_id_from_the_hub_cache_offline(
    trained, tmp_path: Path, monkeypatch
) -> None:
    """A Hub id resolves through huggingface_hub; offline, from its cache (the layout
    ``hf download`` leaves)."""
    from huggingface_hub import constants

    model = module_inference_model(trained)
    commit = "0" * 40
    repo = tmp_path / "hub" / "models--someone--tiny-radio"
    save_hf(model, repo / "snapshots" / commit, "card\n")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)
    images = torch.rand(1, 3, 32, 48)
    with torch.no_grad():
        _assert_same(radio_lit.load("someone/tiny-radio")(images), model(images))


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        (
            {
                "class_path": "x.OpenCLIPTeacher",
                "init_args": {"model_name": "ViT-L-14", "pretrained": "openai"},
            },
            ("OpenCLIPTeacher", "ViT-L-14 (openai)", "MIT"),
        ),
        (
            {"class_path": "x.DINOv2Teacher", "init_args": {"model": "vit_large_patch14_dinov2"}},
            ("DINOv2Teacher", "vit_large_patch14_dinov2", "apache-2.0"),
        ),
        (
            {
                "class_path": "x.TransformersTeacher",
                "init_args": {"model": "facebook/dinov3-vitl16"},
            },
            ("TransformersTeacher", "facebook/dinov3-vitl16", "DINOv3 License (Meta)"),
        ),
        (
            {"class_path": "x.SAMTeacher", "init_args": {"checkpoint": "sam_vit_h_4b8939.pth"}},
            ("SAMTeacher", "SAMTeacher (sam_vit_h_4b8939.pth)", "apache-2.0"),
        ),
        (
            {"class_path": "x.SAMTeacher", "init_args": {"encoder_kwargs": {"depth": 2}}},
            ("SAMTeacher", "SAMTeacher (random)", "none: random weights, not pretrained"),
        ),
    ],
)
def test_teacher_sources_and_licences(spec, expected) -> None:
    assert teacher_source(spec) == expected


def test_model_paths_take_the_folder_and_refuse_other_folders(
    hf_run, tmp_path: Path, monkeypatch
) -> None:
    """What radio-lit evaluate / predict --model_path accept: the folder, not just any folder;
    an unknown Hub id offline is one line."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    _, folder = hf_run
    assert model_file(folder, "--model_path") == folder
    mode = (folder / "model.safetensors").stat().st_mode & 0o777
    umask = os.umask(0o022)
    os.umask(umask)
    assert mode == 0o666 & ~umask  # readable as torch.save's files are, not safetensors' 0600
    with pytest.raises(FileNotFoundError, match="holds no model radio-lit loads"):
        model_file(tmp_path, "--model_path")
    with pytest.raises(FileNotFoundError, match="no local path, and the Hub model"):
        radio_lit.load("nobody/nothing-here")
