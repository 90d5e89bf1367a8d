"""``radio-lit cache`` and ``radio-lit fit`` from the cache, through the real CLI: what is
written, resuming, disjoint shards, and one line for each bad input (missing or truncated
shard, a cache of another config, a full disk) that loses nothing already written."""

from __future__ import annotations

import contextlib
import io
import json
import shlex
import shutil
from collections import namedtuple
from pathlib import Path
from typing import Any

import pytest
import yaml
from lightning.pytorch.callbacks import Callback
from safetensors.torch import load as load_safetensors

from radio_lit.cache import Manifest
from radio_lit.cache.manifest import epoch_order
from radio_lit.cli.app import main
from radio_lit.cli.evaluate import _run_cli
from tests.teachers.tiny import tiny_teacher_configs


def _config(tmp_path: Path, **teacher_overrides: dict) -> Path:
    teachers = tiny_teacher_configs(sam_resolution=64)
    teachers.pop("dino")
    for name, init in teacher_overrides.items():
        teachers[name]["init_args"].update(init)
    config = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "max_steps": 3,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
        },
        "model": {
            "student": {
                "class_path": "radio_lit.students.CPEViT",
                "init_args": {
                    "model": "vit_tiny_patch16_224",
                    "max_resolution": 128,
                    "model_kwargs": {"depth": 1, "embed_dim": 32, "num_heads": 2},
                },
            },
            "student_resolution": 32,
            "teachers": teachers,
        },
        "data": {
            "class_path": "radio_lit.data.ImageFolderDataModule",
            "init_args": {
                "train_dir": "radio_lit:sample_images",
                "val_dir": "radio_lit:sample_images",
                "crop_size": 64,
                "batch_size": 4,
                "num_workers": 0,
            },
        },
    }
    path = tmp_path / f"run-{len(list(tmp_path.glob('run-*.yaml')))}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


@pytest.fixture(autouse=True)
def _in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``radio-lit fit`` writes its config.yaml in the working folder."""
    monkeypatch.chdir(tmp_path)


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run ``radio-lit ARGV`` in-process; its exit status and its last stderr line."""
    try:
        main(argv)
        status = 0
    except SystemExit as exit:
        status = int(exit.code or 0)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("radio-lit: error:")]
    return status, errors[-1] if errors else ""


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A run config and its cache: 10 images x 2 views in 5 shards of 4 samples; the
    ``radio-lit fit`` command that the cache command printed last is in ``cache/printed``."""
    root = tmp_path_factory.mktemp("cache")
    config = _config(root)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        main(
            ["cache", "--config", str(config), "--out", str(root / "cache")]
            + ["--views", "2", "--samples-per-shard", "4", "--data.init_args.num_workers", "0"]
        )
    (root / "printed").write_text(printed.getvalue().splitlines()[-1])
    return config, root / "cache"


def test_cache_layout(written: tuple[Path, Path]) -> None:
    _, cache = written
    manifest = Manifest.load(cache)
    assert (manifest.num_samples, manifest.num_shards) == (20, 5)
    assert manifest.teachers["clip"]["shapes"] == {
        "clip/56x56/features": [4, 4, 64],
        "clip/56x56/summary": [32],
    }
    assert manifest.teachers["sam"]["shapes"] == {"sam/64x64/features": [4, 4, 32]}
    assert manifest.bytes_per_view == {
        "pixels": 3 * 64 * 64,
        "clip": 4 * (4 * 4 * 64 + 32),
        "sam": 4 * 4 * 4 * 32,
    }
    shards = sorted(cache.glob("shard-*.tar"))
    assert len(shards) == 5 and not list(cache.glob("*.partial"))
    # a plain webdataset shard: members <key>.safetensors, no pickle
    import webdataset as wds

    sample = next(iter(wds.WebDataset(str(shards[0]), shardshuffle=False)))
    first = epoch_order(10, 0, 0)[0]  # the first image a one-rank run sees
    assert sample["__key__"] == f"i{first:09d}_v0000"
    tensors = load_safetensors(sample["safetensors"])
    assert set(tensors) == {  # the outputs computed in a one-rank run's batches
        "pixels",
        "clip/56x56/features@1",
        "clip/56x56/summary@1",
        "sam/64x64/features@1",
    }
    assert sum(path.stat().st_size for path in shards) <= 5 * (4 * manifest.sample_bytes + 10240)
    # every file readable as the user's umask allows (safetensors alone makes its files 0600)
    modes = {path.name: path.stat().st_mode & 0o777 for path in cache.iterdir()}
    assert set(modes.values()) == {modes["manifest.json"]}, modes


class RecordRun(Callback):
    """Writes a run's training losses, validation metrics and teacher classes to ``path``."""

    def __init__(self, path: str) -> None:
        self.path, self.losses, self.val = Path(path), [], {}

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, *args: Any) -> None:
        self.losses.append(float(outputs["loss"]))

    def on_validation_end(self, trainer: Any, module: Any) -> None:
        metrics = trainer.callback_metrics
        self.val = {k: float(v) for k, v in metrics.items() if k.startswith("val/")}

    def on_train_end(self, trainer: Any, module: Any) -> None:
        teachers = {name: type(t).__name__ for name, t in module.teachers.items()}
        record = {"losses": self.losses, "val": self.val, "teachers": teachers}
        self.path.write_text(json.dumps(record))


@pytest.mark.slow
def test_fit_from_cache_is_the_live_run_without_its_teachers(
    tmp_path: Path, written: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The cached run is the command ``radio-lit cache`` printed (was: none printed)."""
    config, cache = written
    printed = shlex.split((cache.parent / "printed").read_text())
    assert printed[:2] == ["radio-lit", "fit"] and printed[-2:] == ["--data.path", str(cache)]
    runs = {}
    for name, command in (("live", ["fit", "--config", str(config)]), ("cached", printed[1:])):
        record = {
            "class_path": f"{__name__}.RecordRun",
            "init_args": {"path": str(tmp_path / name)},
        }
        argv = [*command, "--trainer.callbacks+", json.dumps(record)]
        assert _run(argv, capsys) == (0, "")
        runs[name] = json.loads((tmp_path / name).read_text())
    live, cached = runs["live"], runs["cached"]
    assert cached["teachers"] == {"clip": "CachedTeacher", "sam": "CachedTeacher"}
    assert live["teachers"] == {"clip": "OpenCLIPTeacher", "sam": "SAMTeacher"}
    assert len(live["losses"]) == 3 and cached["losses"] == live["losses"]  # exactly
    assert "val/sam/fidelity" in live["val"] and cached["val"] == live["val"]
    saved = yaml.safe_load(Path("config.yaml").read_text())  # as given, not the stand-ins
    assert saved["model"]["teachers"]["sam"]["class_path"] == "radio_lit.teachers.SAMTeacher"
    # radio-lit evaluate builds a checkpoint's run without a subcommand: the real teachers
    assert type(_run_cli("config.yaml").model.teachers["sam"]).__name__ == "SAMTeacher"


def test_resume_keeps_finished_shards(tmp_path: Path, written: tuple[Path, Path]) -> None:
    config, cache = written
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    (copy / "shard-000003.tar").rename(copy / "shard-000003.tar.partial")  # killed mid-shard
    (copy / "shard-000001.tar").unlink()
    kept = {p.name: p.stat().st_mtime_ns for p in copy.glob("shard-*.tar")}
    main(
        [
            "cache",
            "--config",
            str(config),
            "--out",
            str(copy),
            "--views",
            "2",
            "--samples-per-shard",
            "4",
        ]
    )
    for name, mtime in kept.items():
        assert (copy / name).stat().st_mtime_ns == mtime
    for name in ("shard-000001.tar", "shard-000003.tar"):
        assert (copy / name).read_bytes() == (cache / name).read_bytes()


def test_disjoint_shards(tmp_path: Path, written: tuple[Path, Path]) -> None:
    config, cache = written
    for index in (0, 1):
        main(
            ["cache", "--config", str(config), "--out", str(tmp_path), "--views", "2"]
            + ["--samples-per-shard", "4", "--shard-index", str(index), "--num-shards", "2"]
        )
        names = sorted(p.name for p in tmp_path.glob("shard-*.tar"))
        assert names == [f"shard-{j:06d}.tar" for j in range(5) if j % 2 <= index]
    for path in cache.glob("shard-*.tar"):
        assert (tmp_path / path.name).read_bytes() == path.read_bytes()


@pytest.mark.slow
def test_bad_caches_give_one_line(
    tmp_path: Path, written: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config, cache = written
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    fit = [
        "fit",
        "--config",
        str(config),
        "--data",
        "radio_lit.cache.CachedViews",
        "--data.path",
        str(copy),
    ]

    (copy / "shard-000002.tar").unlink()
    status, error = _run(fit, capsys)
    assert (
        status == 2 and "shard-000002.tar is missing" in error and "radio-lit cache again" in error
    )

    shutil.copy(cache / "shard-000002.tar", copy / "shard-000002.tar")
    (copy / "val.safetensors").unlink()
    status, error = _run(fit, capsys)
    assert status == 2 and "val.safetensors are missing" in error

    shutil.copy(cache / "val.safetensors", copy / "val.safetensors")
    with (copy / "shard-000004.tar").open("r+b") as shard:
        shard.truncate(5000)
    status, error = _run(fit, capsys)
    assert status == 2 and "shard-000004.tar is truncated (5000 of" in error

    shutil.copy(cache / "shard-000004.tar", copy / "shard-000004.tar")
    other = _config(tmp_path, sam={"resolution": 96})  # SAM sees another view
    status, error = _run(["fit", "--config", str(other), *fit[3:]], capsys)
    assert status == 2
    assert (
        "teacher sam differs from the cache" in error
        and "init_args.resolution 64 in the cache, 96 in this run" in error
    )

    no_sam = yaml.safe_load(config.read_text())
    no_sam["model"]["teachers"]["dino"] = tiny_teacher_configs()["dino"]
    (tmp_path / "dino.yaml").write_text(yaml.safe_dump(no_sam))
    status, error = _run(["fit", "--config", str(tmp_path / "dino.yaml"), *fit[3:]], capsys)
    assert status == 2 and "has no teacher dino" in error

    status, error = _run(
        ["cache", "--config", str(other), "--out", str(copy), "--views", "2"], capsys
    )
    assert status == 2 and "holds a cache of another config" in error
    assert sorted(p.name for p in copy.iterdir()) == sorted(p.name for p in cache.iterdir())


def test_full_disk_refused_before_writing(
    tmp_path: Path,
    written: tuple[Path, Path],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config, _ = written
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 1000, 1000))
    status, error = _run(
        ["cache", "--config", str(config), "--out", str(tmp_path), "--views", "2"], capsys
    )
    assert status == 2
    assert "KiB for the cache but its disk has 1000 B free: free some space" in error
    assert not list(tmp_path.glob("shard-*"))


def test_bad_options_give_one_line(
    tmp_path: Path, written: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config, _ = written
    base = ["cache", "--config", str(config), "--out", str(tmp_path)]
    status, error = _run([*base, "--views", "zero"], capsys)
    assert status == 2 and "--views must be a positive integer or 'epochs', got 'zero'" in error
    status, error = _run([*base, "stray"], capsys)
    assert status == 2 and "unexpected argument 'stray'" in error
    status, error = _run([*base, "--view", "2"], capsys)  # never taken for --views
    assert status == 2 and "Unrecognized arguments: --view 2" in error
    assert "did you mean '--views'" in error
    assert not list(tmp_path.iterdir())  # nothing written


def _damage(path: Path, offset: int, count: int) -> None:
    """Overwrite ``count`` bytes of ``path`` at ``offset`` in place (same size)."""
    with path.open("r+b") as file:
        file.seek(offset)
        old = file.read(count)
        file.seek(offset)
        file.write(bytes(b ^ 0xFF for b in old))


def test_damaged_or_misplaced_samples_give_one_line_and_no_run_folder(
    tmp_path: Path, written: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Bytes overwritten inside a shard (same size) are found by the sample's checksum when
    read, in a DataLoader worker too; a shard holding other samples by their keys. One line
    naming the shard and the fix, exit 2, and no empty version folder."""
    config, cache = written
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    fit = ["fit", "--config", str(config), "--data", "radio_lit.cache.CachedViews"]
    fit += ["--data.path", str(copy), "--data.num_workers", "1", "--trainer.logger", "true"]
    index = json.loads((copy / "shard-000000.json").read_text())
    _, offset, size, _ = index["samples"][1]
    _damage(copy / "shard-000000.tar", offset + size // 2, 1024)
    status, error = _run(fit, capsys)
    assert status == 2
    assert f"cache shard {copy / 'shard-000000.tar'} is damaged" in error
    assert "does not match its checksum): remove it and run radio-lit cache again" in error
    assert not list(tmp_path.glob("lightning_logs/version_*"))

    shutil.copy(cache / "shard-000000.tar", copy / "shard-000000.tar")
    for suffix in ("tar", "json"):  # shard 1 (4 samples, same size) where shard 0 belongs
        shutil.copy(cache / f"shard-000001.{suffix}", copy / f"shard-000000.{suffix}")
    status, error = _run(fit, capsys)
    assert status == 2 and f"cache shard {copy / 'shard-000000.tar'} holds i" in error
    assert ".safetensors belongs: run radio-lit cache again" in error


def test_a_changed_weight_file_or_library_makes_the_cache_stale(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The teachers are not built from a cache: their weight files are checked by size and
    mtime, then by sha256; one changed byte is refused with one line, as is another version
    of a library; ``accept_stale`` trains anyway."""
    import torch
    from segment_anything.modeling import ImageEncoderViT

    from radio_lit.cache import identity
    from tests.teachers.tiny import TINY_SAM_ENCODER

    weights = tmp_path / "sam.pth"
    encoder = ImageEncoderViT(**TINY_SAM_ENCODER)
    torch.save({f"image_encoder.{k}": v for k, v in encoder.state_dict().items()}, weights)
    config = _config(tmp_path, sam={"checkpoint": str(weights)})
    assert (
        _run(["cache", "--config", str(config), "--out", "cache", "--views", "1"], capsys)[0] == 0
    )
    fit = ["fit", "--config", str(config), "--data", "radio_lit.cache.CachedViews"]
    fit += ["--data.path", "cache", "--trainer.max_steps", "1", "--trainer.limit_val_batches", "0"]

    weights.write_bytes(weights.read_bytes())  # same bytes, a new mtime: hashed, accepted
    assert _run(fit, capsys) == (0, "")

    _damage(weights, weights.stat().st_size // 2, 1)
    status, error = _run(fit, capsys)
    assert status == 2
    assert f"teacher sam's weight file {weights} changed since the cache was written" in error
    assert "write it again with radio-lit cache" in error and "accept_stale true" in error
    assert _run([*fit, "--data.accept_stale", "true"], capsys) == (0, "")

    _damage(weights, weights.stat().st_size // 2, 1)  # the original bytes again
    versions = {**identity.libraries(), "timm": "0.0.1"}
    monkeypatch.setattr(identity, "libraries", lambda: versions)
    status, error = _run(fit, capsys)
    assert status == 2 and "timm " in error and "wrote the cache, 0.0.1 is installed" in error


def test_views_epochs_writes_only_the_steps_the_run_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """3 steps of 4 images over 10 items: all of epoch 0 (2 steps) and epoch 1's first
    step, 14 samples, not 2 whole views (20); the run from it takes its 3 steps, and a run
    of more steps is refused with one line."""
    config = _config(tmp_path)
    written = ["cache", "--config", str(config), "--out", "cache", "--views", "epochs"]
    assert _run(written, capsys)[0] == 0
    manifest = Manifest.load("cache")
    assert (manifest.views, manifest.num_samples) == (2, 14)
    fit = ["fit", "--config", str(config), "--data", "radio_lit.cache.CachedViews"]
    fit += ["--data.path", "cache", "--trainer.limit_val_batches", "0"]
    assert _run(fit, capsys) == (0, "")
    status, error = _run([*fit, "--trainer.max_steps", "4"], capsys)
    assert status == 2
    assert "trainer.max_steps: the cache cache holds the first 3 steps" in error


def test_a_cache_of_an_older_format_gives_one_line(
    tmp_path: Path, written: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    config, cache = written
    copy = tmp_path / "cache"
    shutil.copytree(cache, copy)
    record = json.loads((copy / "manifest.json").read_text())
    for key in ("grouping", "identity", "samples"):  # what format 3 added
        record.pop(key)
    (copy / "manifest.json").write_text(json.dumps({**record, "format": 2}))
    fit = ["fit", "--config", str(config), "--data", "radio_lit.cache.CachedViews"]
    status, error = _run([*fit, "--data.path", str(copy)], capsys)
    assert status == 2 and "has cache format 2, this radio_lit reads 3" in error
    assert "write the cache again with radio-lit cache" in error
