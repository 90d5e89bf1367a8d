"""TrainingProgressGuard: a run whose update trains nothing stops at that update, naming the
parameters, the step and the cause, before a checkpoint of the step is written."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from radio_lit.callbacks import FreezeBody, NonFiniteGuard, TrainingProgressGuard
from radio_lit.callbacks.progress_guard import ZERO_GRADIENT_UPDATES
from radio_lit.core.errors import NoTrainingProgress
from tests import forking
from tests.builders import cpu_trainer, image_batches, tiny_module


def fit(tmp_path, module, *callbacks, max_steps=4, batch_size=4, save_every=1, **options):
    checkpoints = ModelCheckpoint(
        dirpath=tmp_path / "checkpoints",
        save_last=True,
        every_n_train_steps=save_every,
        save_top_k=0,
    )
    options = dict(max_steps=max_steps, enable_checkpointing=True, **options)
    trainer = cpu_trainer(tmp_path, callbacks=[*callbacks, checkpoints], **options)
    trainer.fit(module, image_batches(2 * batch_size, batch_size))
    return trainer


def saved_step(tmp_path) -> int | None:
    last = tmp_path / "checkpoints" / "last.ckpt"
    return torch.load(last, weights_only=True)["global_step"] if last.exists() else None


def test_a_training_run_passes_every_check(tmp_path):
    """Heads checked at step 0, the trunk when FreezeBody releases it (step 2), every group
    again at step 2 (every_n_steps=2); the run trains to its end."""
    torch.manual_seed(0)
    guard = TrainingProgressGuard(every_n_steps=2)
    callbacks = FreezeBody(steps=2), guard, NonFiniteGuard()
    trainer = fit(tmp_path, tiny_module(), *callbacks, max_steps=5)
    assert trainer.global_step == 5
    assert guard.checked_groups == {
        "trunk_decay",
        "trunk_no_decay",
        "heads_decay",
        "heads_no_decay",
    }


def test_a_learning_rate_of_0_stops_the_first_update(tmp_path):
    module = tiny_module(optimizer=partial(torch.optim.AdamW, lr=0.0))
    with pytest.raises(NoTrainingProgress) as stopped:
        fit(tmp_path, module, TrainingProgressGuard())
    message = str(stopped.value)
    assert "\n" not in message
    assert message.startswith("no training progress at step 0: ")
    assert "parameter group 'trunk_decay'" in message and "learning rate is 0" in message
    assert "student.patch_generator" in message or "student." in message
    assert saved_step(tmp_path) is None  # no checkpoint of the step that trained nothing


class CutBlock(pl.Callback):
    """Cuts the student's first block from the graph: its output is detached."""

    def on_fit_start(self, trainer, pl_module):
        pl_module.student.blocks[0].register_forward_hook(lambda m, i, out: out.detach())


def test_a_student_part_cut_from_the_graph_stops_when_the_trunk_is_released(tmp_path):
    """The heads train while the trunk is frozen (steps 0-1, checkpointed); at step 2 the
    trunk's first update finds the parameters before the cut without a gradient."""
    torch.manual_seed(0)
    with pytest.raises(NoTrainingProgress) as stopped:
        fit(tmp_path, tiny_module(), CutBlock(), FreezeBody(steps=2), TrainingProgressGuard())
    message = str(stopped.value)
    assert message.startswith("no training progress at step 2: student.")
    assert "blocks.0." in message
    assert "got no gradient or an all-zero one: not reached by the backward pass" in message
    assert "FSDP2" in message and "blocks.1." not in message.split(" got no gradient")[0]
    assert saved_step(tmp_path) == 2  # the heads' two steps, not the failed third


class ZeroLearningRate(pl.Callback):
    """Sets the heads' learning rate to 0 from step ``step`` on."""

    def __init__(self, step):
        self.step = step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step >= self.step:
            for group in trainer.optimizers[0].param_groups:
                if group["name"].startswith("heads"):
                    group["lr"] = 0.0


def test_a_group_that_stops_moving_is_caught_at_the_next_check(tmp_path):
    torch.manual_seed(0)
    guard = TrainingProgressGuard(every_n_steps=2)
    stopped = r"at step 4: the parameters of parameter group 'heads_decay' \(heads\..*\) "
    with pytest.raises(NoTrainingProgress, match=stopped + r"stopped changing \(learning rate 0\)"):
        fit(tmp_path, tiny_module(), ZeroLearningRate(step=3), guard, max_steps=6)
    assert saved_step(tmp_path) == 4


def test_a_skipped_step_is_not_judged(tmp_path):
    """NonFiniteGuard dropping a bad step's gradients is no lack of progress."""
    from tests.callbacks.test_guard import PoisonGradient

    torch.manual_seed(0)
    guard = TrainingProgressGuard(every_n_steps=1)
    fit(tmp_path, tiny_module(), PoisonGradient(step=1), NonFiniteGuard(max_skipped_steps=1), guard)
    assert saved_step(tmp_path) == 4


class ZeroInitializedHead(pl.Callback):
    """Starts every feature head's last layer at zero (an output that starts at 0): the
    layers before it get exactly zero gradients at the first update only."""

    def on_fit_start(self, trainer, pl_module):
        for pair in pl_module.heads.values():
            torch.nn.init.zeros_(pair.features.out.weight)
            torch.nn.init.zeros_(pair.features.out.bias)


def test_a_zero_initialized_output_layer_trains_without_a_stop(tmp_path):
    """Zero gradients that reached the parameters are judged again at the next updates."""
    torch.manual_seed(0)
    guard = TrainingProgressGuard(every_n_steps=0)
    trainer = fit(tmp_path, tiny_module(), ZeroInitializedHead(), guard, max_steps=4)
    assert trainer.global_step == 4
    assert {"heads_decay", "heads_no_decay"} <= guard.checked_groups


class MultipliedByZero(pl.Callback):
    """Multiplies the student's first block's output by 0: its gradients stay all zero."""

    def on_fit_start(self, trainer, pl_module):
        pl_module.student.blocks[0].register_forward_hook(lambda m, i, out: 0 * out)


def test_gradients_that_stay_zero_stop_the_run_after_the_grace_updates(tmp_path):
    torch.manual_seed(0)
    with pytest.raises(NoTrainingProgress, match="got no gradient or an all-zero one") as stop:
        fit(tmp_path, tiny_module(), MultipliedByZero(), TrainingProgressGuard(), max_steps=8)
    assert f"at step {ZERO_GRADIENT_UPDATES}:" in str(stop.value)
    assert "blocks.0." in str(stop.value)


@pytest.mark.parametrize(
    ("weights", "left_out"),
    [
        (dict(summary_weights={"clip": 0.0}), "heads.clip.summary left out"),
        (
            dict(feature_weights={"dino": 0.0}, summary_weights={"dino": 0.0}),
            "heads.dino.features, heads.dino.summary left out",
        ),
    ],
)
def test_a_zero_loss_weight_ablation_trains_to_its_end(tmp_path, caplog, weights, left_out):
    """A weight of 0 removes a term: its head gets only zero gradients. The head is left out
    of the check (said in the log), every other parameter is checked."""
    torch.manual_seed(0)
    guard = TrainingProgressGuard(every_n_steps=1)
    with caplog.at_level("INFO"):
        trainer = fit(tmp_path, tiny_module(**weights), guard, max_steps=6)
    assert trainer.global_step == 6
    assert left_out in caplog.text and "every loss weight 0" in caplog.text
    assert {"trunk_decay", "heads_decay", "heads_no_decay"} <= guard.checked_groups


class WarmupFromZero(pl.Callback):
    """Replaces the module's schedule by a linear warm-up that starts at learning rate 0."""

    def on_train_start(self, trainer, pl_module):
        config = trainer.lr_scheduler_configs[0]
        optimizer = trainer.optimizers[0]
        config.scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: s / 4)


def test_a_warm_up_from_a_learning_rate_of_0_is_no_stop(tmp_path):
    """The first update at rate 0 moves nothing; its check moves to the next update."""
    torch.manual_seed(0)
    guard = TrainingProgressGuard(every_n_steps=2)
    trainer = fit(tmp_path, tiny_module(), WarmupFromZero(), guard, max_steps=4)
    assert trainer.optimizers[0].param_groups[0]["lr"] > 0
    assert trainer.global_step == 4 and len(guard.checked_groups) == 4


def test_a_featsharp_warm_up_from_0_trains(tmp_path):
    """``FeatSharpModule(warmup_start=0)`` through radio-lit's CLI (its quickstart)."""
    from radio_lit.cli.app import RadioLitCLI

    config = Path(__file__).resolve().parents[2] / "configs" / "featsharp" / "quickstart.yaml"
    args = ["fit", "--config", str(config), "--trainer.max_steps=3"]
    args += ["--model.init_args.warmup_start=0", "--trainer.val_check_interval=3"]
    args += [f"--trainer.logger.init_args.save_dir={tmp_path}", "--data.init_args.repeats=1"]
    cli = RadioLitCLI(args=args)
    assert cli.trainer.global_step == 3
    guard = next(c for c in cli.trainer.callbacks if isinstance(c, TrainingProgressGuard))
    assert guard.checked_groups


def test_a_student_part_cut_at_step_50_stops_the_run_at_the_check_of_step_50(tmp_path):
    """Momentum and weight decay keep the cut parameters moving: only their gradients,
    checked one by one, show the cut."""
    from tests.callbacks.cuts import CutStudent

    torch.manual_seed(0)
    guard = TrainingProgressGuard(every_n_steps=25)
    with pytest.raises(NoTrainingProgress) as stopped:
        module, cut = tiny_module(), CutStudent(step=50)
        fit(tmp_path, module, cut, guard, max_steps=60, batch_size=1, save_every=10)
    message = str(stopped.value)
    assert message.startswith("no training progress at step 50: student.")
    assert "got no gradient or an all-zero one: not reached by the backward pass" in message
    assert "blocks.0." in message and "\n" not in message
    assert saved_step(tmp_path) == 50  # every step before the cut, not the step of the cut


def test_a_group_shared_by_trunk_and_heads_checks_the_trunk_when_it_is_released(tmp_path):
    """One parameter group for everything: the heads' first update does not verify the
    frozen trunk's parameters; the trunk's own first update (step 2) finds the cut."""
    torch.manual_seed(0)

    def one_group(groups):
        return torch.optim.AdamW([p for g in groups for p in g["params"]], lr=1e-3)

    module = tiny_module(optimizer=one_group)
    guard = TrainingProgressGuard(every_n_steps=100)
    with pytest.raises(NoTrainingProgress, match="at step 2: student.") as stopped:
        fit(tmp_path, module, CutBlock(), FreezeBody(steps=2), guard, max_steps=4)
    assert "parameter group 'param_groups[0]'" in str(stopped.value)


class DroppedTeachers(pl.Callback):
    """Records, per step, the teachers whose every term had weight 0 in the step's total."""

    def __init__(self):
        self.dropped: list[set[str]] = []

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        weights = pl_module.balancer.effective_weights()
        teachers = {key.split("/")[0] for key in weights}
        kept = {key.split("/")[0] for key, w in weights.items() if float(w) > 0}
        self.dropped.append(teachers - kept)


def test_teacher_dropping_on_a_batch_of_1_trains_to_its_end(tmp_path):
    """With one image a step, a teacher is dropped (probability 0.9) for many updates in a
    row: its head's zero gradients are no cut."""
    from radio_lit.losses import TeacherDropping

    torch.manual_seed(0)
    guard = TrainingProgressGuard(every_n_steps=1)
    record = DroppedTeachers()
    module = tiny_module(balancer=partial(TeacherDropping, p=0.9))
    trainer = fit(tmp_path, module, record, guard, max_steps=10, batch_size=1)
    assert trainer.global_step == 10
    streaks = {
        name: max(
            len(run) for run in "".join("x" if name in d else " " for d in record.dropped).split()
        )
        for name in ("clip", "dino", "sam")
        if any(name in d for d in record.dropped)
    }
    assert max(streaks.values()) > ZERO_GRADIENT_UPDATES  # the case this test is about


class Overflow(pl.Callback):
    """Records the GradScaler's scale after every step."""

    def __init__(self):
        self.scales: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.scales.append(trainer.precision_plugin.scaler.get_scale())


def test_fp16s_first_step_overflow_is_not_judged_without_a_nonfinite_guard(tmp_path):
    """fp16 mixed precision (here on the CPU: its autocast and GradScaler) overflows at its
    first steps and the GradScaler skips them, lowering its scale; those steps are not
    judged. The guard alone, as in the FeatSharp configs."""
    from lightning.pytorch.plugins import MixedPrecision

    torch.manual_seed(0)
    precision = MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))
    scales, guard = Overflow(), TrainingProgressGuard(every_n_steps=2)
    trainer = fit(tmp_path, tiny_module(), scales, guard, max_steps=6, plugins=[precision])
    assert trainer.global_step == 6
    assert scales.scales[0] < 65536.0  # the first update overflowed and was skipped
    assert {"heads_decay", "heads_no_decay"} <= guard.checked_groups


def _radio_lit_fit(*args: str, cwd: Path) -> tuple[int, str]:
    """``radio-lit fit --config configs/quickstart.yaml ARGS`` in ``cwd``:
    ``radio_lit.cli.app.main`` (what the console script runs) in a process forked from the
    tests' fork server
    (:mod:`tests.forking`: a fork, not a fresh interpreter's ~7 CPU seconds of imports);
    (exit code, stderr)."""
    root = Path(__file__).resolve().parents[2]
    argv = ["fit", "--config", str(root / "configs" / "quickstart.yaml"), *args]
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = forking.run("radio_lit.cli.app:main", [argv], cwd / "forked", 600, env=env, cwd=cwd)
    return done.exitcode, done.stderr


@pytest.fixture(scope="module")
def commands(tmp_path_factory):
    """The quickstart through the real command, concurrently: a zero-weight ablation (past
    the trunk's release at step 20) and the student cut at step 50."""
    root = Path(__file__).resolve().parents[2]
    jobs = {
        "zero weights": [
            "--model.feature_weights.dino=0",
            "--model.summary_weights.dino=0",
            "--trainer.max_steps=24",
        ],
        "cut at 50": ["--config", str(root / "tests" / "callbacks" / "cut_at_step_50.yaml")],
    }
    folders = {name: tmp_path_factory.mktemp("guard-cli") for name in jobs}
    forking.ensure_server()
    with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
        futures = {
            name: pool.submit(_radio_lit_fit, *args, cwd=folders[name])
            for name, args in jobs.items()
        }
        return {name: (*futures[name].result(), folders[name]) for name in jobs}


@pytest.mark.slow
def test_the_quickstart_with_a_teachers_weights_0_trains_through_the_command(commands):
    status, stderr, folder = commands["zero weights"]
    assert status == 0, stderr[-3000:]
    assert "heads.dino.features, heads.dino.summary left out of the check" in stderr
    assert list(folder.rglob("last.ckpt"))


@pytest.mark.slow
def test_a_student_cut_at_step_50_stops_the_command_there_with_one_line(commands):
    status, stderr, folder = commands["cut at 50"]
    assert status == 2, stderr[-3000:]
    assert "Traceback" not in stderr
    lines = [line for line in stderr.splitlines() if line.startswith("radio-lit: error:")]
    assert len(lines) == 1, stderr[-3000:]
    assert lines[0].startswith("radio-lit: error: no training progress at step 50: student.")
    saved = [torch.load(c, weights_only=True)["global_step"] for c in folder.rglob("*.ckpt")]
    assert saved and max(saved) == 50  # the 50 steps before the cut, not the step of the cut
