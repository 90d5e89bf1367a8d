"""FeatSharp's training as a user runs it: ``radio-lit fit --config
configs/featsharp/quickstart.yaml`` trains, logs (losses, statistics, PCA panels) and
checkpoints; its normalizer is estimated before the first optimizer step from the
low-resolution pass and never changes after; an UpsampledTeacher built from the checkpoint
is the trained upsampler on the teacher it was trained for; a run killed with SIGKILL
resumes exactly (slow)."""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from radio_lit.cli.app import RadioLitCLI
from radio_lit.teachers import OpenCLIPTeacher
from radio_lit.upsamplers import FeatSharp, FusionBlock, UpsampledTeacher
from radio_lit.upsamplers.module import TEACHER_WEIGHTS, teacher_weights
from tests import forking
from tests.cli.test_resume import kill_when_paused, run_overlay
from tests.teachers.tiny import TINY_SIGLIP_CFG

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = str(ROOT / "configs" / "featsharp" / "quickstart.yaml")


class NormalizerStates(pl.Callback):
    """The upsampler's normalizer buffers just before every optimizer step."""

    def __init__(self) -> None:
        self.states: list[dict[str, torch.Tensor]] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        normalizer = pl_module.upsampler.normalizer
        assert normalizer.is_fitted  # fitted before the first step
        self.states.append({k: v.clone() for k, v in normalizer.state_dict().items()})
        if len(self.states) == 1:  # the bias as the pre-pass started it
            self.bias_start = pl_module.upsampler.bias.bias.detach().clone()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The quickstart, 30 steps (a checkpoint and PCA panels at step 30), in this process,
    with the normalizer recorded before every optimizer step."""
    root = tmp_path_factory.mktemp("featsharp")
    args = [
        "--config",
        QUICKSTART,
        "--trainer.max_steps=30",
        "--trainer.val_check_interval=30",
    ]
    args += [f"--trainer.logger.init_args.save_dir={root}", "--data.init_args.repeats=4"]
    cli = RadioLitCLI(args=args, run=False)
    recorder = NormalizerStates()
    cli.trainer.callbacks.append(recorder)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    cli.normalizer_states, cli.bias_start = recorder.states, recorder.bias_start
    return cli, Path(cli.trainer.log_dir)


def test_the_normalizer_is_fixed_before_the_first_step_from_the_low_resolution_pass(trained):
    """FeatSharp's PHI-S space (notes 2.1): a pre-pass over the config's 10 batches of the
    low-resolution pass (4 images of 4x4 tokens each), then bit-identical at every step."""
    cli, _ = trained
    states = cli.normalizer_states
    assert len(states) == 30
    first = states[0]
    assert float(first["count"]) == 10 * 4 * 4 * 4  # no tile pass, no views
    for step, state in enumerate(states):
        for key, value in state.items():
            assert torch.equal(value, first[key]), (step, key)
    final = cli.model.upsampler.normalizer.state_dict()
    assert all(torch.equal(final[k], first[k]) for k in first)


def test_the_quickstart_trains_logs_and_checkpoints(trained):
    cli, run = trained
    assert cli.trainer.global_step == 30
    events = EventAccumulator(str(run))
    events.Reload()
    scalars = set(events.Tags()["scalars"])
    assert {"train/loss", "train/mse", "train/uncertainty", "train/bias_rms", "val/loss"} <= scalars
    assert {"stats/teacher/alpha", "stats/teacher/effective_rank"} <= scalars  # PHI-S first
    panels = events.Images("featsharp/pca/0")  # teacher | bilinear | tiles | FeatSharp
    assert panels and (panels[-1].width, panels[-1].height) == (4 * 128, 128)
    loss = [e.value for e in events.Scalars("train/mse")]
    assert sum(loss[-2:]) < sum(loss[:2])  # consistency improves
    start = cli.bias_start  # the pre-pass's position-locked mean, negated [choice]
    assert float(start.abs().max()) > 0 and float(start.mean((1, 2)).abs().max()) < 1e-5
    assert not torch.equal(cli.model.upsampler.bias.bias.detach(), start)  # the bias learns
    # the groups' rates: the paper's (JBU 0.2x, uncertainty 0.02x) and the bias's 100x [choice]
    rates = {}
    for group in cli.trainer.optimizers[0].param_groups:
        for name, parameter in cli.model.named_parameters():
            if any(parameter is p for p in group["params"]):
                rates[name] = group["lr"]
    base = rates["upsampler.fusion.scale1"]
    assert rates["upsampler.bias.bias"] == pytest.approx(100 * base)
    assert rates["upsampler.base.stages.0.log_sigma_spatial"] == pytest.approx(0.2 * base)
    saved = torch.load(run / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == 30
    assert not any(k.startswith("teacher.") for k in saved["state_dict"])  # frozen, not saved
    assert any(k.startswith("upsampler.normalizer.") for k in saved["state_dict"])


def test_an_upsampled_teacher_loads_the_trained_upsampler_and_its_teacher(trained):
    cli, run = trained
    cfg = {**TINY_SIGLIP_CFG, "embed_dim": 96}
    torch.manual_seed(123)  # other random weights: the checkpoint's replace them
    inner = OpenCLIPTeacher("radio-lit-tiny-siglip2", model_cfg=cfg, resolution=64)
    upsampler = functools.partial(
        FeatSharp, factor=3, fusion=functools.partial(FusionBlock, heads=4)
    )
    checkpoint = str(run / "checkpoints" / "last.ckpt")
    teacher = UpsampledTeacher(inner, upsampler, checkpoint=checkpoint, min_student_grid=6)
    crops = torch.rand(2, 3, 192, 192)
    trained_module = cli.model.eval()
    expected = trained_module.upsampler.upsample(trained_module.teacher, crops)
    out = teacher(crops, teacher.view_size((8, 8)))
    assert out.features.shape == (2, 12, 12, 96)
    torch.testing.assert_close(out.features, expected.features)
    torch.testing.assert_close(out.summary, expected.summary)
    low = teacher(crops, teacher.view_size((4, 4)))  # a low-resolution grid: the raw teacher
    torch.testing.assert_close(low.features, trained_module.teacher(crops).features)
    with pytest.raises(FileNotFoundError, match="radio-lit fit --config configs/featsharp"):
        UpsampledTeacher(inner, upsampler, checkpoint=str(run / "missing.ckpt"))


# -- kill and resume -------------------------------------------------------------------------
STEPS, KILL_AT = 6, 3


#: the normalizer's pre-pass: the killed run's; the resumed run has it from its checkpoint
PRE_PASS = "--model.init_args.statistics_batches=2"


def _config(run_dir: Path, pause_at: int | None = None) -> Path:
    data = {"val_dir": None, "repeats": 1, "num_workers": 2}
    return run_overlay(run_dir, [], data, STEPS, pause_at, "featsharp.yaml")


def _fit(run_dir: Path, *extra: str) -> dict:
    argv = ["fit", "--config", QUICKSTART, "--config", str(_config(run_dir)), PRE_PASS, *extra]
    result = forking.run("radio_lit.cli.app:main", [argv], run_dir / "fit", 600)
    assert result.exitcode == 0, result.stderr[-1500:]
    return torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=True)["state_dict"]


@pytest.mark.slow
def test_a_killed_featsharp_run_resumes_exactly(tmp_path):
    killed_dir = tmp_path / "killed"
    argv = ["fit", "--config", QUICKSTART, "--config", str(_config(killed_dir, KILL_AT)), PRE_PASS]
    run = forking.start("radio_lit.cli.app:main", [argv], killed_dir / "run", new_session=True)
    try:
        uninterrupted = _fit(tmp_path / "whole")
        last = kill_when_paused(killed_dir, run, KILL_AT)
    finally:
        if run.alive():
            os.killpg(run.pid, signal.SIGKILL)
            run.wait(time.monotonic() + 60)
    resumed = _fit(killed_dir, "--ckpt_path", str(last))
    assert uninterrupted.keys() == resumed.keys()
    statistics = [k for k in resumed if k.startswith("upsampler.normalizer.")]
    assert statistics
    for key in statistics:
        assert torch.equal(resumed[key], uninterrupted[key]), key
    for key in resumed:
        torch.testing.assert_close(resumed[key], uninterrupted[key], rtol=1e-5, atol=1e-6, msg=key)


def test_quickstart_c_radio_steps_with_the_trained_quickstart_upsampler(
    trained, tmp_path, monkeypatch
):
    """The two commands of configs/quickstart-c-radio.yaml's comments: the quickstart's
    checkpoint given as ``--model.teachers.siglip2.init_args.checkpoint``; its high partition
    then upsamples with the trained upsampler and the very teacher it was trained on."""
    _, run = trained
    checkpoint = run / "checkpoints" / "last.ckpt"
    args = ["--config", str(ROOT / "configs" / "quickstart-c-radio.yaml")]
    args += [f"--model.teachers.siglip2.init_args.checkpoint={checkpoint}"]
    args += ["--trainer.max_steps=2", "--trainer.logger=false"]
    args += [f"--trainer.default_root_dir={tmp_path}"]
    cli = RadioLitCLI(args=args, run=False)
    teacher = cli.model.teachers["siglip2"]
    saved = torch.load(checkpoint, weights_only=True)
    torch.testing.assert_close(
        teacher.upsampler.bias.bias, saved["state_dict"]["upsampler.bias.bias"], rtol=0, atol=0
    )
    fusion = [k for k in saved["state_dict"] if k.startswith("upsampler.fusion.")]
    assert fusion
    for key in fusion:
        loaded = teacher.upsampler.state_dict()[key.removeprefix("upsampler.")]
        torch.testing.assert_close(loaded, saved["state_dict"][key], rtol=0, atol=0)
    weights = teacher_weights(teacher.teacher)  # keep_teacher_weights: the run's teacher
    assert weights.keys() == saved[TEACHER_WEIGHTS].keys()
    for key, value in saved[TEACHER_WEIGHTS].items():
        torch.testing.assert_close(weights[key], value, rtol=0, atol=0, msg=key)
    upsample, calls = teacher.upsampler.upsample, []
    monkeypatch.setattr(teacher.upsampler, "upsample", lambda *a: calls.append(1) or upsample(*a))
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    assert cli.trainer.global_step == 2
    assert calls  # the high partition's SigLIP2 targets came from the upsampler
    assert torch.isfinite(cli.trainer.callback_metrics["train/loss"])
