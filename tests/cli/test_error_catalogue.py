"""The error catalogue: every known bad input, through the real ``radio-lit`` command.

Each entry runs ``radio-lit fit --config configs/quickstart.yaml <bad input>`` (the console
script's ``radio_lit.cli.main``) in its own process and expects exit code 2, one short message
naming the config key and the problem, and no traceback. The processes fork from the tests'
fork server (:mod:`tests.forking`), four at a time, so an entry costs a fork, not an
interpreter start.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from radio_lit import cli
from radio_lit.data.image_folder import list_images
from radio_lit.errors import TRACEBACK_ENV
from tests import forking

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")

#: name -> (extra arguments, text the message must contain). ``{tmp}`` is a scratch folder
#: holding ``empty/`` (no images) and ``corrupt.ckpt`` (random bytes).
CATALOGUE: dict[str, tuple[list[str], list[str]]] = {
    "wrong class path": (
        ["--model.teachers.clip.class_path", "radio_lit.teachers.Nope"],
        ["model.teachers", "radio_lit.teachers.Nope", "has no attribute 'Nope'"],
    ),
    "teacher width without a Hadamard matrix": (
        [
            "--model.teachers.dino.init_args.model_kwargs",
            "{depth: 2, embed_dim: 6, num_heads: 2, img_size: 56}",
        ],
        ["model.normalizer", "Hadamard", "order 6", "Standardize"],
    ),
    "missing SAM checkpoint": (
        ["--model.teachers.sam.init_args.checkpoint", "{tmp}/sam_vit_h.pth"],
        ["model.teachers.sam", "SAM checkpoint not found", "sam_vit_h.pth"],
    ),
    "empty image folder": (
        ["--data.init_args.train_dir", "{tmp}/empty"],
        ["data.init_args.train_dir", "no images found"],
    ),
    "missing image folder": (
        ["--data.init_args.train_dir", "{tmp}/missing"],
        ["data.init_args.train_dir", "does not exist"],
    ),
    "missing validation folder": (
        ["--data.init_args.val_dir", "{tmp}/missing"],
        ["data.init_args.val_dir", "does not exist"],
    ),
    "student resolution not a multiple of the patch": (
        ["--model.student_resolution", "70"],
        ["model.student_resolution", "patch size 16", "use e.g. 64"],
    ),
    "unknown timm teacher": (
        ["--model.teachers.dino.init_args.model", "vit_nope_dinov2"],
        ["model.teachers.dino", "unknown timm model 'vit_nope_dinov2'", "timm.list_models"],
    ),
    "unknown timm student": (
        ["--model.student.init_args.model", "vit_nope"],
        ["model.student", "unknown timm model 'vit_nope'"],
    ),
    "unknown open_clip model": (
        [
            "--model.teachers.clip.init_args.model_cfg",
            "null",
            "--model.teachers.clip.init_args.model_name",
            "ViT-Nope-16",
        ],
        ["model.teachers.clip", "unknown open_clip model 'ViT-Nope-16'"],
    ),
    "missing init_from": (
        ["--model.init_from", "{tmp}/stage1.ckpt"],
        ["model.init_from", "does not exist", "stage1.ckpt"],
    ),
    "corrupt init_from": (
        ["--model.init_from", "{tmp}/corrupt.ckpt"],
        ["model.init_from", "cannot be read as a checkpoint", "corrupt.ckpt"],
    ),
    "unknown teacher in feature_weights": (
        ["--model.feature_weights", "{nope: 1.0}"],
        ["model.feature_weights", "unknown teachers ['nope']", "'clip', 'dino', 'sam'"],
    ),
    "shard pattern that matches nothing": (
        [
            "--data",
            "radio_lit.data.WebDatasetDataModule",
            "--data.init_args.urls",
            "{tmp}/shards/{00000..00003}.tar",
            "--data.init_args.samples_per_epoch",
            "16",
        ],
        ["data.init_args.urls", "4 of 4 shards do not exist", "00000.tar"],
    ),
    "unknown option": (
        ["--trainer.max_stepz", "3"],
        ["Unrecognized arguments", "--trainer.max_stepz"],
    ),
    "value of the wrong type": (
        ["--trainer.max_steps", "many"],
        ["trainer.max_steps", "Expected a <class 'int'>", "many"],
    ),
    "non-positive batch size": (
        ["--data.init_args.batch_size", "0"],
        ["batch_size=0", "must be positive"],
    ),
}


def _run(args: list[str], env: dict[str, str], folder: Path) -> forking.Outcome:
    argv = ["fit", "--config", QUICKSTART, *args]
    return forking.run("radio_lit.cli:main", [argv], folder, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Run every catalogue entry (and one with tracebacks on) concurrently."""
    tmp = tmp_path_factory.mktemp("catalogue")
    (tmp / "empty").mkdir()
    (tmp / "corrupt.ckpt").write_bytes(os.urandom(2048))
    env = dict(os.environ)
    env.pop(TRACEBACK_ENV, None)
    jobs = {
        name: ([a.replace("{tmp}", str(tmp)) for a in args], env)
        for name, (args, _) in CATALOGUE.items()
    }
    jobs["traceback on request"] = (
        ["--model.student_resolution", "70"],
        {**env, TRACEBACK_ENV: "1"},
    )
    jobs["diverging run"] = (
        [
            "--model.optimizer.init_args.lr",
            "1e12",
            "--trainer.max_steps",
            "4",
            "--trainer.logger.init_args.save_dir",
            str(tmp / "diverging"),
            "--trainer.default_root_dir",
            str(tmp / "diverging"),
        ],
        env,
    )
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {
            name: pool.submit(_run, *job, tmp / "runs" / str(i))
            for i, (name, job) in enumerate(jobs.items())
        }
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CATALOGUE))
def test_bad_input_gets_one_short_message_and_exit_code_2(outcomes, name):
    result = outcomes[name]
    assert result.exitcode == 2, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "radio-lit: error:" in line]
    assert len(error_lines) == 1, result.stderr[-3000:]
    message = result.stderr[result.stderr.index("radio-lit: error:") :]
    assert len(message.splitlines()) <= 4, message
    for text in CATALOGUE[name][1]:
        assert text in message, f"{text!r} not in {message!r}"


@pytest.mark.slow
def test_the_traceback_is_shown_on_request(outcomes):
    result = outcomes["traceback on request"]
    assert result.exitcode == 2
    assert "Traceback (most recent call last)" in result.stderr
    assert "model.student_resolution 70" in result.stderr


@pytest.mark.slow
def test_a_diverging_run_stops_with_the_cause_and_saves_no_nan(outcomes, tmp_path_factory):
    """``radio-lit fit --config configs/quickstart.yaml --model.optimizer.init_args.lr 1e12``."""
    result = outcomes["diverging run"]
    assert result.exitcode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "radio-lit: error: non-finite gradients at step 1" in result.stderr
    assert "clip/feature_loss" in result.stderr
    assert "model.optimizer.init_args.lr" in result.stderr
    run_dir = next(tmp_path_factory.getbasetemp().glob("catalogue*/diverging"))
    for checkpoint in run_dir.rglob("*.ckpt"):
        state = torch.load(checkpoint, weights_only=True)["state_dict"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


def _list_images_command(argv: list[str]) -> None:
    """A subcommand taking a folder argument, as ``radio-lit <name> FOLDER`` would."""
    list_images(argv[0])


def test_subcommand_errors_get_the_same_treatment(monkeypatch, capsys):
    monkeypatch.setitem(cli.SUBCOMMANDS, "explode", f"{__name__}:_list_images_command")
    monkeypatch.delenv(TRACEBACK_ENV, raising=False)
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["explode", "/no/such/folder"])
    assert exit_info.value.code == 2
    stderr = capsys.readouterr().err
    assert "radio-lit: error: image folder /no/such/folder does not exist" in stderr
    assert "Traceback" not in stderr
