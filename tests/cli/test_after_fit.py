"""What ``radio-lit fit`` does after training, on every rank."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from radio_lit.cli.app import RadioLitCLI
from radio_lit.evaluation.base import Evaluation, Report


class _Trainer:
    """A trainer of one rank whose ``log_dir`` is a collective, as under DDP."""

    def __init__(self, rank: int) -> None:
        self.is_global_zero = rank == 0
        self.interrupted = False
        self.checkpoint_callback = None
        self.log_dir_calls = 0
        self.callback_metrics: dict = {}
        self.callbacks: list = []
        self.global_step = 0

    @property
    def log_dir(self) -> str:
        self.log_dir_calls += 1  # DDPStrategy.broadcast: every rank must take part
        return "runs/version_0"


def test_every_rank_takes_part_in_finding_the_run_folder(capsys):
    """Lightning's ``Trainer.log_dir`` broadcasts rank 0's folder: a rank that skipped it
    would leave rank 0 waiting in the broadcast (a 2-rank DDP fit crashed at its end)."""
    trainers = [_Trainer(rank) for rank in (0, 1)]
    for trainer in trainers:
        RadioLitCLI.after_fit(SimpleNamespace(trainer=trainer))  # type: ignore[arg-type]
    assert [t.log_dir_calls for t in trainers] == [1, 1]
    assert capsys.readouterr().out == "run folder: runs/version_0\n"  # printed by rank 0 only


def test_fit_ends_with_its_last_validation_and_evaluation_results(capsys):
    """A row per measure, a column per output: the validation metrics papers report (not the
    losses), each evaluation callback's last scalars; the run folder after them."""
    trainer = _Trainer(0)
    trainer.global_step = 300
    trainer.callback_metrics = {
        "val/clip/fidelity": torch.tensor(3.3),
        "val/sam/fidelity": torch.tensor(7.6341),
        "val/clip/feature_loss": torch.tensor(0.3),
        "val/fidelity_geomean": torch.tensor(5.0242),
        "train/loss": torch.tensor(0.5),
    }
    knn = Evaluation()
    knn.last_report = Report(scalars={"eval/knn/backbone/top1": 87.5, "eval/knn/clip/top1": 83.75})
    trainer.callbacks = [knn, Evaluation()]  # the second has not run
    RadioLitCLI.after_fit(SimpleNamespace(trainer=trainer))  # type: ignore[arg-type]
    assert capsys.readouterr().out.splitlines() == [
        "results at step 300",
        "                      backbone   clip    sam",
        "val/fidelity                 -    3.3  7.634",
        "eval/knn/top1             87.5  83.75      -",
        "val/fidelity_geomean  5.024",
        "",
        "run folder: runs/version_0",
    ]
