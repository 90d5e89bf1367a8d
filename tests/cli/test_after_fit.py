"""What ``radio-lit fit`` does after training, on every rank."""

from __future__ import annotations

from types import SimpleNamespace

from radio_lit.cli import RadioLitCLI


class _Trainer:
    """A trainer of one rank whose ``log_dir`` is a collective, as under DDP."""

    def __init__(self, rank: int) -> None:
        self.is_global_zero = rank == 0
        self.interrupted = False
        self.checkpoint_callback = None
        self.log_dir_calls = 0

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
