"""Uneven partition layouts on several gloo ranks equal one process (AM-RADIO 4, PHI-S 3).

With fewer ranks than partitions, partition ``p`` runs on rank ``p mod W``, so ranks run
different numbers of chunks per step: three partitions on 2 ranks ([2, 1] chunks, DINOv2 twice
on rank 0, SAM only on rank 1), four on 3 ranks ([2, 1, 1]). Every collective of the step
(statistics, AdaLoss, DDP, metrics, the guard) must be issued alike on every rank, or the run
hangs or pairs reductions wrongly; and one rank running several partitions must equal several
ranks running one each. Each layout trains once per balancer (one worker launch per layout),
with ZCA whitening estimated over the first steps and a validation epoch, and is compared with
the 1-process run of the same plan on the same images.

The resume test kills a 2-rank run between two refits of the statistics, while rank 0 does not
run SAM, and resumes it: the statistics must be bit-equal to those of an uninterrupted run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.distributed.gloo import run_gloo_workers
from tests.partitions import partitioned_worker as worker

pytestmark = pytest.mark.distributed

WORKER = Path(worker.__file__).resolve()


def _close(actual: torch.Tensor, expected: torch.Tensor, what: str, scale: float = 0.0) -> None:
    """Equal up to float reordering: sums over another split of the images (a rank's chunks,
    then DDP's average) differ in the last bits; a wrong weight is off by far more."""
    atol = max(1e-4 * scale, 1e-6)
    torch.testing.assert_close(
        actual.double(), expected.double(), rtol=1e-5, atol=atol, msg=lambda m: f"{what}: {m}"
    )


def _compare(
    ranks: list[dict[str, Any]], single: dict[str, Any], start: dict[str, torch.Tensor], label: str
) -> None:
    for rank, result in enumerate(ranks):
        what = f"{label}, rank {rank}"
        for key, value in single["weights"].items():
            update = (value - start[key]).abs().max().item()
            _close(result["weights"][key], value, f"{what} weight {key}", update)
        for name, state in single["normalizers"].items():
            for key, value in state.items():
                actual = result["normalizers"][name][key]
                if value.dtype == torch.bool:
                    assert torch.equal(actual, value), f"{what} {name}.{key}"
                elif key in ("count", "mean", "m2"):  # the same rows: exact up to merge order
                    _close(actual, value, f"{what} {name}.{key}")
        for key, value in single["balancer"].items():
            _close(result["balancer"][key].double(), value.double(), f"{what} balancer.{key}")
        assert set(result["val"]) == set(single["val"]), what
        for key, value in single["val"].items():
            _close(result["val"][key], value, f"{what} {key}")


@pytest.mark.parametrize("plan", ["three", "four"])
def test_uneven_layouts_equal_one_process(plan: str, tmp_path: Path) -> None:
    world = worker.WORLD_SIZES[plan]
    ranks = run_gloo_workers(WORKER, tmp_path, "layouts", plan, world_size=world)
    assert {k for r in ranks for k in r} == set(worker.BALANCERS)
    for balancer in worker.BALANCERS:
        single = worker.train(plan, balancer, 0, 1, tmp_path / "single" / balancer)
        assert any(k.endswith("/fidelity") for k in single["val"])
        assert torch.isfinite(torch.stack(list(single["val"].values()))).all()
        initial = worker.build(plan, balancer)  # the same seed: the initial weights
        start = {k: p.detach() for k, p in initial.trainable_parameters()}
        moved = [k for k, v in single["weights"].items() if not torch.equal(v, start[k])]
        assert moved, f"{balancer}: SGD moved no weight"
        label = f"{plan} on {world} ranks, {balancer}"
        _compare([r[balancer] for r in ranks], single, start, label)


def test_resume_between_refits_keeps_every_teachers_statistics(tmp_path: Path) -> None:
    """Rank 0 does not run SAM; the last checkpoint is taken after the refit at step 0 and
    before the one at step 3, so SAM's accumulators of step 1 exist only on rank 1 then."""
    for phase in ("full", "killed", "resumed"):
        (tmp_path / phase).mkdir()
    full = run_gloo_workers(WORKER, tmp_path / "full", "resume", "full", str(tmp_path / "a"))
    run = str(tmp_path / "b")
    run_gloo_workers(WORKER, tmp_path / "killed", "resume", "killed", run, returncode=-9)
    saved = torch.load(Path(run) / "checkpoints" / "last.ckpt", weights_only=True)
    assert saved["global_step"] == worker.KILL_AT
    sam = {k: v for k, v in saved["state_dict"].items() if k.startswith("normalizers.sam.")}
    assert (
        sam["normalizers.sam.count"]
        == full[1]["normalizers"]["sam"]["count"] * 2 / worker.RESUME_STEPS
    )
    resumed = run_gloo_workers(WORKER, tmp_path / "resumed", "resume", "resumed", run)
    for rank in range(2):
        for name, state in full[rank]["normalizers"].items():
            for key, value in state.items():
                got = resumed[rank]["normalizers"][name][key]
                assert torch.equal(got, value), f"rank {rank} {name}.{key} after resume"
