"""Multi-node torchrun, on this machine: two torchrun agents (two "nodes" of one process each)
meet in a c10d rendezvous on localhost, as ``launch/torchrun/multinode.sh`` starts them, and
train the quickstart with two teacher partitions; the same command on one node of 2 processes
trains the same. Both must end with the same weights and statistics. Both runs go at once; the
one-node ranks are forked from the tests' fork server with the environment a launcher gives its
ranks (tests/distributed, as the preemption tests start theirs): a fork, not a torchrun agent
and two interpreters more (~25 CPU-s)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml

from tests import forking
from tests.cli.test_resume import QUICKSTART, write_config
from tests.distributed.test_distributed_fit import _FOREIGN_ENV_PREFIXES, _free_port
from tests.distributed.test_distributed_fit import _env as _rank_env

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
MULTINODE = ROOT / "launch" / "torchrun" / "multinode.sh"
TIMEOUT_S = 400
STEPS = 4
PARTITIONS = {
    "clip_dino": {"teachers": ["clip", "dino"], "batch_size": 4},
    "dino_sam": {"teachers": ["dino", "sam"], "batch_size": 2},
}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_ENV_PREFIXES)}
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]
    env.update(
        PATH=os.pathsep.join([str(Path(sys.executable).parent), env["PATH"]]),
        PYTHONPATH=os.pathsep.join(paths),
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME="lo",
        **extra,
    )
    return env


def _config(folder: Path) -> Path:
    config = yaml.safe_load(write_config(folder).read_text())
    config["trainer"]["max_steps"] = STEPS
    for callback in config["trainer"]["callbacks"]:  # one checkpoint: the last step's
        if callback["class_path"].endswith("ModelCheckpoint"):
            callback["init_args"]["every_n_train_steps"] = STEPS
    config["data"]["init_args"]["num_workers"] = 0
    config["model"] = {"partitions": PARTITIONS}
    config["trainer"]["strategy"] = {  # teachers on some ranks only: statistics not broadcast
        "class_path": "lightning.pytorch.strategies.DDPStrategy",
        "init_args": {"broadcast_buffers": False},
    }
    (folder / "run.yaml").write_text(yaml.safe_dump(config))
    return folder / "run.yaml"


def _start(folder: Path, argv: list[str], env: dict[str, str], name: str) -> subprocess.Popen:
    log = open(folder / f"{name}.log", "w")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """``{"two-nodes": folder, "one-node": folder}`` once every agent and rank has exited 0."""
    folders = {name: tmp_path_factory.mktemp(name) for name in ("two-nodes", "one-node")}
    fit = ["--config", QUICKSTART, "--config"]
    port = _free_port()
    agents = [
        (
            folders["two-nodes"],
            _start(
                folders["two-nodes"],
                ["bash", str(MULTINODE), QUICKSTART, "--config", str(_config(folders["two-nodes"]))]
                + ["--trainer.num_nodes", "2", "--trainer.devices", "1"],
                _env(NNODES="2", NPROC_PER_NODE="1", RDZV_HOST="127.0.0.1")
                | {"RDZV_PORT": str(port), "RUN_ID": "radio-lit-test"},
                f"node{node}",
            ),
        )
        for node in range(2)
    ]
    single = ["fit", *fit, str(_config(folders["one-node"])), "--trainer.devices", "2"]
    one_node_port = _free_port()
    ranks = [
        forking.start(
            "radio_lit.cli.app:main",
            [single],
            folders["one-node"] / f"rank{rank}",
            _rank_env(one_node_port, rank),
            cwd=ROOT,
        )
        for rank in range(2)
    ]
    deadline = time.monotonic() + TIMEOUT_S
    outcomes = [r.wait(deadline) for r in ranks]
    for folder, agent in agents:
        try:
            code = agent.wait(max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for _, other in agents:
                other.kill()
            code = "timeout"
        logs = "\n".join(p.read_text()[-3000:] for p in folder.glob("*.log"))
        assert code == 0, logs
    for rank, outcome in enumerate(outcomes):
        assert outcome.exitcode == 0, f"one-node rank {rank}:\n{outcome.stderr[-3000:]}"
    return folders


def test_two_torchrun_nodes_train_as_one_node_of_two_processes(runs):
    two, one = (
        torch.load(runs[name] / "checkpoints" / "last.ckpt", weights_only=True)
        for name in ("two-nodes", "one-node")
    )
    assert two["global_step"] == one["global_step"] == STEPS
    keys = [k for k in one["state_dict"] if k.startswith(("normalizers.", "student.", "heads."))]
    assert any(k.startswith("normalizers.") for k in keys)
    for key in keys:
        torch.testing.assert_close(two["state_dict"][key], one["state_dict"][key], msg=key)
