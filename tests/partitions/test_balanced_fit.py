"""The balanced layout on 2 gloo ranks (:mod:`tests.partitions.balanced_worker`): C-RADIOv4's
two resolution partitions, every rank taking its share of each, against the block layout the
report's cluster runs (one partition per rank) on the same images.

- A step's objective (the ranks' losses averaged, as DDP averages their gradients), its
  averaged gradients and the teachers' statistics equal the block layout's, with the weighted
  balancer and with teacher dropping, the progress guard on; under FSDP2 (the recipe's
  strategy) the balanced step equals DDP's.
- A checkpointed run resumed on 2 ranks is bit-equal to the uninterrupted one; resumed on 1
  rank (the same images in one batch) it equals it up to float reordering.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.distributed.gloo import run_gloo_workers
from tests.partitions import balanced_worker as worker

pytestmark = pytest.mark.distributed

WORKER = Path(worker.__file__).resolve()


def _close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """Equal up to float reordering (a rank's share, then DDP's average); a wrong partition
    weight would be off by a fraction of the whole value."""
    scale = expected.abs().max().item()
    torch.testing.assert_close(
        actual.double(),
        expected.double(),
        rtol=1e-4,
        atol=max(1e-5 * scale, 1e-7),
        msg=lambda m: f"{what}: {m}",
    )


@pytest.fixture(scope="module")
def launched(tmp_path_factory: pytest.TempPathFactory) -> tuple[list, Path]:
    folder = tmp_path_factory.mktemp("balanced")
    run = folder / "run"
    ranks = run_gloo_workers(WORKER, folder / "layouts", "layouts", str(run))
    return ranks, run


@pytest.mark.parametrize("balancer", list(worker.BALANCERS))
def test_a_step_equals_the_block_layouts(launched, balancer: str) -> None:
    ranks, _ = launched
    blocks = [r[("blocks", balancer)] for r in ranks]
    balanced = [r[("balanced", balancer)] for r in ranks]
    objective = {
        k: torch.stack([r["loss"] for r in v]).mean()
        for k, v in [("blocks", blocks), ("balanced", balanced)]
    }
    assert objective["blocks"] > 0
    _close(objective["balanced"], objective["blocks"], f"{balancer} objective")
    assert blocks[0]["loss"] != pytest.approx(blocks[1]["loss"].item())  # two partitions
    grads = blocks[0]["grads"]
    assert {k.split(".")[0] for k in grads} >= {"student", "heads"}
    for rank, result in enumerate(balanced):
        assert set(result["grads"]) == set(grads), f"rank {rank}"
        for key, value in grads.items():
            _close(result["grads"][key], value, f"{balancer} rank {rank} gradient {key}")
        for name, state in blocks[0]["normalizers"].items():
            for key in ("count", "mean", "m2"):
                if key in state:
                    _close(result["normalizers"][name][key], state[key], f"{name}.{key}")


def test_the_balanced_step_under_fsdp2_equals_ddps(launched) -> None:
    """The recipe's strategy (FSDP2: ``ModelParallelStrategy``) gathers the student in call
    order on every rank: in the balanced layout every rank calls it for both partitions."""
    ranks, _ = launched
    ddp = [r[("balanced", "weighted")] for r in ranks]
    for rank, result in enumerate(r["fsdp2"] for r in ranks):
        _close(result["loss"], ddp[rank]["loss"], f"rank {rank} loss under FSDP2")
        assert set(result["grads"]) == set(ddp[rank]["grads"])
        for key, value in ddp[rank]["grads"].items():
            _close(result["grads"][key], value, f"rank {rank} FSDP2 gradient {key}")


def test_resume_is_exact_on_2_ranks_and_close_on_1(launched, tmp_path: Path) -> None:
    ranks, run = launched
    full = [r["full"] for r in ranks]
    resumed = run_gloo_workers(WORKER, tmp_path / "resumed", "resumed", str(run))
    for rank in range(2):
        for key, value in full[rank]["weights"].items():
            assert torch.equal(resumed[rank]["weights"][key], value), f"rank {rank} {key}"
        for name, state in full[rank]["normalizers"].items():
            for key, value in state.items():
                got = resumed[rank]["normalizers"][name][key]
                assert torch.equal(got, value), f"rank {rank} {name}.{key} after resume"
    one = worker.run("resumed", 0, 1, run)  # the 2-rank checkpoint on one process
    assert torch.equal(one["rng"], full[0]["rng"])  # it drew what the 2 ranks drew
    start = torch.load(run / "checkpoints" / f"step={worker.RESUME_FROM}.ckpt", weights_only=True)
    moved = 0
    for key, value in full[0]["weights"].items():
        _close(one["weights"][key], value, f"2 -> 1 rank {key}")
        moved += not torch.equal(value, start["state_dict"][key])
    assert moved, "the resumed step moved no weight"
    for name, state in full[0]["normalizers"].items():
        for key in ("count", "mean"):
            if key in state:
                _close(one["normalizers"][name][key], state[key], f"2 -> 1 {name}.{key}")
