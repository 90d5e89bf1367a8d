"""The error catalogue: every known bad input, through the real ``radio-lit`` command.

Each entry calls ``radio_lit.cli.app.main`` (what the ``radio-lit`` console script runs) with a
bad command line, in a process forked from the tests' fork server (:mod:`tests.forking`; two
at a time, one per core), and expects exit code 2, one short message naming the option or
config key and the problem, no traceback, and no run folder left behind, within 30 s of its
own (:attr:`tests.forking.Outcome.seconds`: the time it waited for a CPU that other processes
held is not its own, so the limit holds on a loaded machine). Three
checks run concurrently outside this process (one fixture starts them all): the exit status
that a shell sees from the real console command, and, forked from the tests' fork server
(:mod:`tests.forking`), the traceback on request and a diverging run.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from radio_lit.cli import app as cli
from radio_lit.core.errors import TRACEBACK_ENV
from radio_lit.data.image_folder import list_images
from tests import forking

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")
FIT = ["fit", "--config", QUICKSTART]

#: name -> (command line, texts the message must contain). ``{tmp}`` is a scratch folder
#: holding ``empty/`` (no images), ``corrupt/`` (two .jpg files of random bytes),
#: ``corrupt.ckpt`` (random bytes) and ``broken.yaml`` (YAML cut short); ``FIT`` is
#: ``fit --config configs/quickstart.yaml``.
CATALOGUE: dict[str, tuple[list[str], list[str]]] = {
    "wrong class path": (
        [*FIT, "--model.teachers.clip.class_path", "radio_lit.teachers.Nope"],
        ["model.teachers", "radio_lit.teachers.Nope", "has no attribute 'Nope'"],
    ),
    "teacher width without a Hadamard matrix": (
        [
            *FIT,
            "--model.teachers.dino.init_args.model_kwargs",
            "{depth: 2, embed_dim: 6, num_heads: 2, img_size: 56}",
        ],
        ["model.normalizer", "Hadamard", "order 6", "Standardize"],
    ),
    "missing SAM checkpoint": (
        [*FIT, "--model.teachers.sam.init_args.checkpoint", "{tmp}/sam_vit_h.pth"],
        ["model.teachers.sam", "SAM checkpoint not found", "sam_vit_h.pth"],
    ),
    "a callback that needs the logger, without one": (
        [*FIT, "--trainer.logger", "false"],
        ["trainer:", "LearningRateMonitor", "no logger"],
    ),
    "unknown FSDP2 layout": (
        [*FIT, "--model.fsdp2.layout", "block"],
        ["model.fsdp2.layout", "'student', 'blocks'", "block"],
    ),
    "Lightning's own FSDP2 strategy (its checkpoints would not resume)": (
        [
            *FIT,
            "--trainer.strategy",
            '{"class_path": "lightning.pytorch.strategies.ModelParallelStrategy"}',
        ],
        [
            "trainer.strategy",
            "cannot resume",
            "radio_lit.distributed.strategies.ModelParallelStrategy",
        ],
    ),
    "FSDP2 prefetching no block": (
        [*FIT, "--model.fsdp2.prefetch", "0"],
        ["model.fsdp2.prefetch", "must be >= 1", "got 0"],
    ),
    "negative shift spread": (
        [
            *FIT,
            "--model.shifts",
            "radio_lit.geometry.shifts.PatchShifts",
            "--model.shifts.std",
            "-1",
        ],
        ["model.shifts.init_args", "std (-1.0)", "must be >= 0"],
    ),
    "a ViTDet probability without windows": (
        [*FIT, "--model.student.init_args.vitdet_probability", "0.5"],
        ["model.student", "vitdet_probability 0.5 needs vitdet_window_sizes", "set both"],
    ),
    "a fixed summary dispersion for a teacher without a summary": (
        [
            *FIT,
            "--model.summary_loss",
            "radio_lit.losses.AngleBalanced",
            "--model.summary_loss.dispersion",
            "{sam: 1.0}",
        ],
        ["model.summary_loss.init_args.dispersion", "['sam']", "not teachers with a summary"],
    ),
    "empty image folder": (
        [*FIT, "--data.init_args.train_dir", "{tmp}/empty"],
        ["data.init_args.train_dir", "no images found"],
    ),
    "missing image folder": (
        [*FIT, "--data.init_args.train_dir", "{tmp}/missing"],
        ["data.init_args.train_dir", "does not exist"],
    ),
    "missing validation folder": (
        [*FIT, "--data.init_args.val_dir", "{tmp}/missing"],
        ["data.init_args.val_dir", "does not exist"],
    ),
    "student resolution not a multiple of the patch": (
        [*FIT, "--model.student_resolution", "70"],
        ["model.student_resolution", "patch size 16", "use e.g. 64"],
    ),
    "unknown timm teacher": (
        [*FIT, "--model.teachers.dino.init_args.model", "vit_nope_dinov2"],
        ["model.teachers.dino", "unknown timm model 'vit_nope_dinov2'", "timm.list_models"],
    ),
    "unknown timm student": (
        [*FIT, "--model.student.init_args.model", "vit_nope"],
        ["model.student", "unknown timm model 'vit_nope'"],
    ),
    "unknown open_clip model": (
        [
            *FIT,
            "--model.teachers.clip.init_args.model_cfg",
            "null",
            "--model.teachers.clip.init_args.model_name",
            "ViT-Nope-16",
        ],
        ["model.teachers.clip", "unknown open_clip model 'ViT-Nope-16'"],
    ),
    "missing init_from": (
        [*FIT, "--model.init_from", "{tmp}/stage1.ckpt"],
        ["model.init_from", "does not exist", "stage1.ckpt"],
    ),
    "corrupt init_from": (
        [*FIT, "--model.init_from", "{tmp}/corrupt.ckpt"],
        ["model.init_from", "cannot be read as a checkpoint", "corrupt.ckpt"],
    ),
    "unknown teacher in feature_weights": (
        [*FIT, "--model.feature_weights", "{nope: 1.0}"],
        ["model.feature_weights", "unknown teachers ['nope']", "'clip', 'dino', 'sam'"],
    ),
    "shard pattern that matches nothing": (
        [
            *FIT,
            "--data",
            "radio_lit.data.WebDatasetDataModule",
            "--data.init_args.urls",
            "{tmp}/shards/{00000..00003}.tar",
            "--data.init_args.samples_per_epoch",
            "16",
        ],
        ["data.init_args.urls", "4 of 4 shards do not exist", "00000.tar"],
    ),
    "value of the wrong type": (
        [*FIT, "--trainer.max_steps", "many"],
        ["trainer.max_steps", "Expected a <class 'int'>", "many"],
    ),
    "a wrong-typed value in a class's settings, from a config": (
        [*FIT, "--config", "{data: {init_args: {batch_size: eight}}}"],
        ["data.init_args.batch_size: expected int, got 'eight'"],
    ),
    "a wrong-typed value in one teacher's settings, from a flag": (
        [*FIT, "--model.teachers.dino.init_args.resolution", "big"],
        ["model.teachers.dino.init_args.resolution: expected int, got 'big'"],
    ),
    "a wrong-typed value in one teacher's settings, from a config": (
        [*FIT, "--config", "{model: {teachers: {sam: {init_args: {resolution: huge}}}}}"],
        ["model.teachers.sam.init_args.resolution: expected int, got 'huge'"],
    ),
    "non-positive batch size": (
        [*FIT, "--data.init_args.batch_size", "0"],
        ["data.init_args.batch_size: must be at least 1", "batch_size=0"],
    ),
    "unknown option": (
        [*FIT, "--trainer.max_stepz", "3"],
        ["Unrecognized arguments", "--trainer.max_stepz", "did you mean '--trainer.max_steps'"],
    ),
    "abbreviated option": (
        [*FIT, "--trainer.max_step", "20"],
        ["Unrecognized arguments", "--trainer.max_step", "did you mean '--trainer.max_steps'"],
    ),
    "misspelt key": (
        [*FIT, "--model.normalzer", "radio_lit.normalizers.PhiS"],
        ["--model.normalzer", "did you mean '--model.normalizer'"],
    ),
    "misspelt class name": (
        [*FIT, "--model.normalizer", "radio_lit.normalizers.PHIS"],
        ["model.normalizer", "has no attribute 'PHIS'", "did you mean 'PhiS'"],
    ),
    "unreachable download": (
        [
            *FIT,
            "--model.teachers.dino.init_args.model_kwargs",
            "null",
            "--model.teachers.dino.init_args.pretrained",
            "true",
        ],
        [
            "model.teachers.dino",
            "timm/vit_small_patch14_reg4_dinov2",
            "cannot be reached",
            "local weights file",
        ],
    ),
    "fit from a missing checkpoint": (
        [*FIT, "--ckpt_path", "{tmp}/nope/last.ckpt"],
        ["--ckpt_path", "nope/last.ckpt does not exist"],
    ),
    "fit from a corrupt checkpoint": (
        [*FIT, "--ckpt_path", "{tmp}/corrupt.ckpt"],
        ["--ckpt_path", "corrupt.ckpt cannot be read as a checkpoint"],
    ),
    "validate a missing checkpoint": (
        ["validate", "--config", QUICKSTART, "--ckpt_path", "{tmp}/nope.ckpt"],
        ["--ckpt_path", "does not exist"],
    ),
    "test without val_dir": (
        ["test", "--config", QUICKSTART, "--data.init_args.val_dir", "null"],
        ["data.init_args.val_dir", "not set"],
    ),
    "evaluate a missing checkpoint": (
        ["evaluate", "--ckpt_path", "{tmp}/nope.ckpt"],
        ["--ckpt_path", "does not exist"],
    ),
    "evaluate a corrupt checkpoint": (
        ["evaluate", "--ckpt_path", "{tmp}/corrupt.ckpt"],
        ["--ckpt_path", "cannot be read as a checkpoint"],
    ),
    "export a missing checkpoint": (
        ["export", "{tmp}/nope.ckpt"],
        ["checkpoint", "does not exist"],
    ),
    "export a corrupt checkpoint": (
        ["export", "{tmp}/corrupt.ckpt"],
        ["cannot be read as a checkpoint"],
    ),
    "export into a folder blocked by a file": (
        ["export", "{tmp}/corrupt.ckpt", "--output", "{tmp}/corrupt.ckpt/export/model"],
        ["--output", "corrupt.ckpt is a file, not a folder", "give another --output"],
    ),
    "evaluate a folder as an exported model": (
        ["evaluate", "--model_path", "{tmp}"],
        ["--model_path", "is a folder, not a model file", "holds no model radio-lit loads"],
    ),
    "an overlay config alone": (
        ["fit", "--config", str(ROOT / "configs" / "quickstart-eradio.yaml")],
        ["quickstart-eradio.yaml is an overlay", "radio-lit fit --config configs/quickstart.yaml"],
    ),
    "a cls summary of a teacher without a class token": (
        [
            *FIT,
            "--model.teachers.dino",
            "{class_path: radio_lit.teachers.TransformersTeacher, init_args: {model: "
            "siglip_vision_model, pretrained: false, summary: cls, model_kwargs: {hidden_size: "
            "32, intermediate_size: 64, num_hidden_layers: 1, num_attention_heads: 2}}}",
        ],
        ["model.teachers.dino", "has no class token", "summary: pooled"],
    ),
    "a training folder whose every image is corrupt (was: a traceback, exit 1, a run folder)": (
        [*FIT, "--data.init_args.train_dir", "{tmp}/corrupt"],
        ["data.init_args.train_dir", "none of the 2 image files", "can be decoded", "readable"],
    ),
    "predict from a missing checkpoint": (
        ["predict", "--ckpt_path", "{tmp}/nope.ckpt", "--images", "{tmp}", "--output", "{tmp}/o"],
        ["--ckpt_path", "does not exist"],
    ),
    "predict from a corrupt checkpoint": (
        [
            "predict",
            "--ckpt_path",
            "{tmp}/corrupt.ckpt",
            "--images",
            "{tmp}",
            "--output",
            "{tmp}/o",
        ],
        ["--ckpt_path", "cannot be read as a checkpoint"],
    ),
    "ablate with a missing base config": (
        ["ablate", "--base", "{tmp}/nope.yaml"],
        ["radio-lit ablate", "--base", "no such config file"],
    ),
    "ablate rows that shift the teachers' views, from a cache": (
        ["ablate", "--row-set", "c-radio", "--cache", "{tmp}/cache"],
        ["radio-lit ablate", "--cache", "c-radio rows shift the teachers' views", "drop --cache"],
    ),
    "segmentation probe on a folder without ADE20k's layout": (
        [*FIT, "--trainer.callbacks+", "radio_lit.evaluation.SegmentationProbe"]
        + ["--trainer.callbacks.root", "{tmp}/empty"],
        ["SegmentationProbe root", "images/training/", "ADE20k's layout"],
    ),
    "an evaluation reading a teacher the model lacks (was: a traceback after training)": (
        [*FIT, "--trainer.callbacks+", "radio_lit.evaluation.KNNClassification"]
        + ["--trainer.callbacks.outputs", "[vit]"],
        ["trainer.callbacks", "KNNClassification reads output 'vit'", "backbone, clip, dino, sam"],
    ),
    "a kNN measure on the summary of a teacher without one": (
        [*FIT, "--trainer.callbacks+", "radio_lit.evaluation.KNNClassification"]
        + ["--trainer.callbacks.outputs", "[sam]"],
        ["trainer.callbacks", "summary of 'sam'", "backbone, clip, dino"],
    ),
    "a teacher declaring another width than its encoder's (was: a traceback at step 1)": (
        [*FIT, "--model.teachers.dino.class_path", "tests.cli.miswired.WideDeclaredTeacher"],
        ["model.teachers.dino", "declares feature_dim 64", "encoder returns 48"],
    ),
    "a normalizer that needs statistics, without TeacherStatsEstimation": (
        [*FIT, "--trainer.callbacks", "[{class_path: radio_lit.callbacks.FreezeBody}]"],
        ["trainer.callbacks", "clip, dino, sam (PhiS)", "TeacherStatsEstimation"],
    ),
    "an estimated summary dispersion, without TeacherStatsEstimation": (
        [*FIT, "--trainer.callbacks", "[{class_path: radio_lit.callbacks.FreezeBody}]"]
        + ["--model.normalizer", "radio_lit.normalizers.Identity"]
        + ["--model.summary_loss", "radio_lit.losses.AngleBalanced"],
        ["trainer.callbacks", "summary dispersions of clip, dino", "AngularDispersion"],
    ),
    "evaluate with a misspelt option": (
        ["evaluate", "--ckpt_pat", "{tmp}/nope.ckpt"],
        ["radio-lit evaluate", "--ckpt_pat", "did you mean '--ckpt_path'"],
    ),
    "cache with a misspelt option": (
        ["cache", "--config", QUICKSTART, "--out", "{tmp}/cache", "--dtyp", "float16"],
        ["radio-lit cache", "--dtyp", "did you mean '--dtype'"],
    ),
    "a misspelt argument of a teacher": (
        [*FIT, "--model.teachers.dino.init_args.modl", "vit_small_patch14_dinov2"],
        [
            "model.teachers.dino.init_args.modl:",
            "DINOv2Teacher takes no argument 'modl'",
            "did you mean 'model'",
        ],
    ),
    "ablate with a misspelt option": (
        ["ablate", "--row-se", "c-radio"],
        ["radio-lit ablate", "--row-se", "did you mean '--row-set'"],
    ),
    "plan with a calibration file cut short": (
        ["plan", "--config", QUICKSTART, "--calibration", "{tmp}/broken.yaml"],
        ["--calibration", "broken.yaml: not valid YAML", "line 3, column 1"],
    ),
    "plan with a config cut short": (
        ["plan", "--config", "{tmp}/broken.yaml"],
        ["--config", "broken.yaml: not valid YAML", "line 3, column 1"],
    ),
    "ablate with a config cut short, said before any row runs": (
        ["ablate", "--rows", "mse", "--config", "{tmp}/broken.yaml"],
        ["--config", "broken.yaml: not valid YAML", "line 3, column 1"],
    ),
    "cache with no sample a shard": (
        ["cache", "--config", QUICKSTART, "--out", "{tmp}/cache", "--samples-per-shard", "0"],
        ["radio-lit cache", "--samples-per-shard must be at least 1", "got 0"],
    ),
    "predict with an abbreviated option": (
        ["predict", "--model_path", "{tmp}/m.safetensors", "--images", "{tmp}"]
        + ["--output", "{tmp}/o", "--batch_siz", "4"],
        ["radio-lit predict", "--batch_siz", "did you mean '--batch_size'"],
    ),
}


BadInput = tuple[forking.Outcome, Path]  # how it ended (its own seconds too), its scratch folder


def _bad_input(name: str, scratch: Path, env: dict[str, str]) -> BadInput:
    """Catalogue entry ``name`` in a fork of the tests' fork server, in the scratch folder
    ``scratch`` (``{tmp}``) as its working directory."""
    (scratch / "empty").mkdir(parents=True)
    (scratch / "corrupt").mkdir()
    for image in ("a.jpg", "b.jpg"):
        (scratch / "corrupt" / image).write_bytes(os.urandom(2048))
    (scratch / "corrupt.ckpt").write_bytes(os.urandom(2048))
    (scratch / "broken.yaml").write_text("device: cpu\ngemm: {float32: [[1, 2\n")
    argv = [a.replace("{tmp}", str(scratch)) for a in CATALOGUE[name][0]]
    outcome = forking.run(
        "radio_lit.cli.app:main", [argv], scratch / "forked", env=env, cwd=scratch
    )
    return outcome, scratch


@pytest.fixture(scope="module")
def bad_inputs(tmp_path_factory) -> dict[str, BadInput]:
    """Every entry, two at a time (one per core), each in a scratch folder of its own as the
    working directory; the Hub at an address that refuses connections, not set offline."""
    env = {**os.environ, "HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "0"}
    env.pop(TRACEBACK_ENV, None)
    root = tmp_path_factory.mktemp("bad_inputs")
    forking.ensure_server()  # each entry's seconds are its own, not the server's start
    with ThreadPoolExecutor(max_workers=2) as pool:
        futures = {
            name: pool.submit(_bad_input, name, root / f"entry{i}", env)
            for i, name in enumerate(CATALOGUE)
        }
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CATALOGUE))
def test_bad_input_gets_one_short_message_and_exit_code_2(bad_inputs, name):
    outcome, scratch = bad_inputs[name]
    stderr = outcome.stderr
    assert outcome.exitcode == 2, stderr[-3000:]
    assert "Traceback" not in stderr
    error_lines = [line for line in stderr.splitlines() if "radio-lit: error:" in line]
    assert len(error_lines) == 1, stderr[-3000:]
    message = stderr[stderr.index("radio-lit: error:") :]
    assert len(message.splitlines()) <= 4, message
    for text in CATALOGUE[name][1]:
        assert text in message, f"{text!r} not in {message!r}"
    assert outcome.seconds is not None and outcome.seconds < 30, (
        f"{outcome.seconds} s of its own before the message"
    )
    assert not list(scratch.glob("lightning_logs/*/version_*")), "a run folder was left behind"


def _command(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """The real ``radio-lit`` command in a fresh interpreter: (exit status, stderr)."""
    command = [sys.executable, "-m", "radio_lit.cli.app", *args]
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )
    return done.returncode, done.stderr


def _forked(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, str]:
    """``radio_lit.cli.app.main(args)`` in a fork of the tests' fork server: (exit code, stderr)."""
    folder = Path(tempfile.mkdtemp(prefix="forked-", dir=cwd))  # its stdout and stderr
    outcome = forking.run("radio_lit.cli.app:main", [args], folder, env=env, cwd=cwd)
    return outcome.exitcode, outcome.stderr


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """The real command in subprocesses, concurrently: an error, one with tracebacks on, a
    diverging run, a run that trains nothing."""
    tmp = tmp_path_factory.mktemp("catalogue")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop(TRACEBACK_ENV, None)
    jobs = {
        "missing checkpoint": (_command, [*FIT, "--ckpt_path", str(tmp / "nope.ckpt")], env),
        "traceback on request": (
            _forked,
            [*FIT, "--model.student_resolution", "70"],
            {**env, TRACEBACK_ENV: "1"},
        ),
        "diverging run": (
            _forked,
            [
                *FIT,
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
        ),
        "learning rate 0": (
            _forked,
            [
                *FIT,
                "--model.optimizer.init_args.lr",
                "0",
                "--trainer.max_steps",
                "4",
                "--trainer.logger.init_args.save_dir",
                str(tmp / "lr0"),
                "--trainer.default_root_dir",
                str(tmp / "lr0"),
            ],
            env,
        ),
    }
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {name: pool.submit(run, args, e, tmp) for name, (run, args, e) in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.slow
def test_the_command_exits_with_status_2_and_leaves_no_run_folder(outcomes, tmp_path_factory):
    status, stderr = outcomes["missing checkpoint"]
    assert status == 2, stderr[-3000:]
    assert stderr.startswith("radio-lit: error: --ckpt_path: checkpoint"), stderr
    assert len(stderr.splitlines()) == 2  # the message and the traceback hint
    run_dir = next(tmp_path_factory.getbasetemp().glob("catalogue*"))
    assert not (run_dir / "lightning_logs").exists()


@pytest.mark.slow
def test_the_traceback_is_shown_on_request(outcomes):
    status, stderr = outcomes["traceback on request"]
    assert status == 2
    assert "Traceback (most recent call last)" in stderr
    assert "model.student_resolution 70" in stderr


@pytest.mark.slow
def test_a_diverging_run_stops_with_the_cause_and_saves_no_nan(outcomes, tmp_path_factory):
    """``radio-lit fit --config configs/quickstart.yaml --model.optimizer.init_args.lr 1e12``."""
    status, stderr = outcomes["diverging run"]
    assert status == 1, stderr[-3000:]
    assert "Traceback" not in stderr
    assert "radio-lit: error: non-finite gradients at step 1" in stderr
    assert "clip/feature_loss" in stderr
    assert "model.optimizer.init_args.lr" in stderr
    run_dir = next(tmp_path_factory.getbasetemp().glob("catalogue*/diverging"))
    for checkpoint in run_dir.rglob("*.ckpt"):
        state = torch.load(checkpoint, weights_only=True)["state_dict"]
        assert all(torch.isfinite(v).all() for v in state.values() if v.is_floating_point())


@pytest.mark.slow
def test_a_run_that_trains_nothing_stops_at_its_first_update(outcomes, tmp_path_factory):
    """``radio-lit fit --config configs/quickstart.yaml --model.optimizer.init_args.lr 0``:
    TrainingProgressGuard stops the first update with one line, exit 2, no checkpoint."""
    status, stderr = outcomes["learning rate 0"]
    assert status == 2, stderr[-3000:]
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.startswith("radio-lit: error:")]
    assert len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith("radio-lit: error: no training progress at step 0: heads.")
    assert "learning rate is 0" in lines[0]
    run_dir = next(tmp_path_factory.getbasetemp().glob("catalogue*/lr0"))
    assert not list(run_dir.rglob("*.ckpt"))


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
