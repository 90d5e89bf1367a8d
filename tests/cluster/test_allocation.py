"""A config that does not use the processes the scheduler started is refused, through the real
``radio-lit fit``, with one line naming both numbers, before any teacher is built."""

from __future__ import annotations

from pathlib import Path

import pytest
from lightning.pytorch.cli import LightningCLI

from radio_lit.cli import app as cli

QUICKSTART = str(Path(__file__).resolve().parents[2] / "configs" / "quickstart.yaml")

#: launcher -> (its variables for rank 0 of 2 processes, what the message names)
LAUNCHERS = {
    "torchrun": (
        {
            "TORCHELASTIC_RUN_ID": "radio-lit-test",
            "WORLD_SIZE": "2",
            "RANK": "0",
            "LOCAL_RANK": "0",
            "GROUP_RANK": "0",
            "LOCAL_WORLD_SIZE": "2",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": "29500",
        },
        "2 processes (WORLD_SIZE (torchrun))",
    ),
    "srun": (
        {
            "SLURM_NTASKS": "2",
            "SLURM_NTASKS_PER_NODE": "2",
            "SLURM_NNODES": "1",
            "SLURM_JOB_NAME": "radio-lit",
            "SLURM_JOB_ID": "7",
            "SLURM_PROCID": "0",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "0",
            "SLURM_NODELIST": "localhost",
        },
        "2 processes (SLURM_NTASKS)",
    ),
}


@pytest.mark.parametrize("launcher", list(LAUNCHERS))
def test_a_config_with_fewer_ranks_than_processes_is_refused_before_teachers_are_built(
    launcher, monkeypatch, tmp_path, capsys
):
    variables, started = LAUNCHERS[launcher]
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.argv", ["radio-lit"])

    def built(self):
        raise AssertionError("the model, its teachers and the trainer were built")

    monkeypatch.setattr(LightningCLI, "instantiate_classes", built)
    with pytest.raises(SystemExit) as stop:
        cli.main(["fit", "--config", QUICKSTART])  # trainer.devices: 1
    assert stop.value.code == 2
    (line,) = [x for x in capsys.readouterr().err.splitlines() if "radio-lit: error:" in x]
    assert f"the scheduler started {started}" in line
    assert "trainer.devices x trainer.num_nodes = 1 x 1 = 1" in line
    assert "--trainer.devices" in line
    assert not (tmp_path / "lightning_logs").exists()
