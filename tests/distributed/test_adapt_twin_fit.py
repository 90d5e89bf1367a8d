"""The adapt twin (``configs/recipes/adapt/quickstart.yaml``, a start from a published model:
its heads imported and composed with each refit of the statistics) on 2 CPU/gloo ranks under
FSDP2 (``ModelParallelStrategy``) and DDP trains as on one process: the same losses and
weights after each step, to float32 noise (:mod:`tests.distributed.adapt_twin_fit`).

The three runs start together, forked from the tests' fork server; the stand-in of the
published model is written once, here, and read by every rank.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from tests import forking
from tests.distributed import adapt_twin_fit as twin
from tests.distributed.test_distributed_fit import (
    _FOREIGN_ENV_PREFIXES,
    RUN_TIMEOUT_S,
    _Launch,
    _result,
)

pytestmark = pytest.mark.distributed

TARGET = f"{twin.__name__}:main"


def _one_process(out: Path, stand_in: str) -> forking.Forked:
    """The twin on one process (no launcher's variables), as ``radio-lit fit`` runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_ENV_PREFIXES)}
    env["OMP_NUM_THREADS"] = "1"
    return forking.start(TARGET, ("one", out, stand_in), out / "log", env)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], list[dict]]]:
    """``runs(kind)``: what each rank of the twin's ``kind`` run wrote (``one``, ``ddp``,
    ``fsdp2``: the three start at once on first use; ``fsdp2-resumed`` after ``fsdp2``)."""
    from tests.published_stand_in import radio_stand_in

    folder = tmp_path_factory.mktemp("adapt-twin")
    stand_in = str(shutil.copy(radio_stand_in(("clip", "dino", "sam")), folder / "start.pth"))
    launches = {
        kind: _Launch.start(kind, tmp_path_factory.mktemp(kind), TARGET, (stand_in,))
        for kind in ("fsdp2", "ddp")
    }
    one_out = tmp_path_factory.mktemp("one")
    one = _one_process(one_out, stand_in)
    started = time.monotonic()
    results: dict[str, list[dict]] = {}

    def get(kind: str) -> list[dict]:
        if kind not in results:
            if kind == "fsdp2-resumed":  # from the FSDP2 run's checkpoint, once it is written
                get("fsdp2")
                saved = launches["fsdp2"].out / "checkpoints" / f"step={twin.RESUME_FROM}.ckpt"
                resumed = tmp_path_factory.mktemp(kind)
                launches[kind] = _Launch.start(kind, resumed, TARGET, (stand_in, str(saved)))
                results[kind] = _result(launches[kind])
            elif kind == "one":
                ended = one.wait(started + RUN_TIMEOUT_S)
                if ended.exitcode != 0:
                    pytest.fail(f"the one-process twin failed:\n{ended.stderr[-12000:]}")
                results[kind] = [torch.load(one_out / "rank0.pt", weights_only=False)]
            else:
                results[kind] = _result(launches[kind])
        return results[kind]

    yield get
    for launch in launches.values():
        launch.kill()
    if one.alive():
        one.process.kill()
        one.process.join()


@pytest.mark.parametrize("kind", ["fsdp2", "ddp"])
def test_the_adapt_twin_on_two_ranks_trains_as_on_one(runs, kind):
    """Each step's loss (the mean of the ranks' losses: each the mean over its half of the
    images) and the student and heads after every step equal the one process's: the imported
    heads composed with each refit of the union's statistics (on FSDP2's shards), the frozen
    trunk at step 0 and its training after. Tolerances: float32 reductions in another order,
    which AdamW turns into weight differences of its step size's order near zero gradients
    (atol 1e-5; 2e-6 measured after 3 steps, where the weights moved by up to 2.5)."""
    ranks, (one,) = runs(kind), runs("one")
    expected = {"fsdp2": ("ModelParallelStrategy", 2), "ddp": ("DDPStrategy", 2)}[kind]
    assert [(r["strategy"], r["world_size"]) for r in ranks] == [expected] * 2
    assert one["strategy"] == "SingleDeviceStrategy"
    if kind == "fsdp2":
        assert ranks[0]["placements"] == ["DTensor"]
    losses = (torch.tensor(ranks[0]["losses"]) + torch.tensor(ranks[1]["losses"])) / 2
    assert len(losses) == twin.MAX_STEPS
    torch.testing.assert_close(losses, torch.tensor(one["losses"]), rtol=1e-5, atol=1e-6)
    initial = one["weights"][0]
    for step, (got, want) in enumerate(zip(ranks[0]["weights"], one["weights"], strict=True)):
        assert got.keys() == want.keys()
        for key, value in want.items():
            torch.testing.assert_close(
                got[key], value, rtol=1e-4, atol=1e-5,
                msg=lambda m, k=key, s=step: f"{kind}: {k} after {s} steps: {m}",
            )  # fmt: skip
    trunk = [k for k in initial if k.startswith("student.")]
    after_frozen, last = one["weights"][1], one["weights"][-1]
    assert all(torch.equal(after_frozen[k], initial[k]) for k in trunk)  # FreezeBody, step 0
    assert any(not torch.equal(last[k], initial[k]) for k in trunk)  # trained after


def test_the_fsdp2_adapt_twin_resumes_exactly(runs):
    """Resumed on 2 ranks from its checkpoint after ``RESUME_FROM`` steps (a distributed
    checkpoint: the student, the imported heads, their spaces and the statistics, the sharded
    optimizer state, the sampler's position), the FSDP2 twin takes the step it took, bit for
    bit: the same computation run twice."""
    full, resumed = runs("fsdp2"), runs("fsdp2-resumed")
    at = twin.RESUME_FROM
    for rank in range(2):
        assert resumed[rank]["losses"] == full[rank]["losses"][at:], f"rank {rank}"
        start, end = resumed[rank]["weights"][0], resumed[rank]["weights"][-1]
        for key, value in full[rank]["weights"][-1].items():
            assert torch.equal(start[key], full[rank]["weights"][at][key]), f"{rank} {key}"
            assert torch.equal(end[key], value), f"rank {rank} {key} after the resumed step"
