"""Each stage of a multi-stage recipe draws its own randomness: its own crops and their order,
view shifts, DAMP noise, CPE windows and dropout, and ViTDet schedule. Every stage starts from
the one before (``model.init_from``); with one seed for all of them, stage 2 would replay
stage 1's draws step for step. The recipes give each stage its own ``seed_everything`` (the
step's draws) and ``data.init_args.seed`` (the crops): the stage number."""

from __future__ import annotations

import os

import pytest
import torch

from benchmarks.gpu_check import stage_chains
from radio_lit.training.student_step import run_seed
from radio_lit.training.views import step_views
from tests.configs.shipped import CONFIGS, cpu_sized, raw

CHAINS = stage_chains(list(CONFIGS.values()))


@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_every_stage_of_a_recipe_has_its_own_seeds(chain):
    stages = [raw(config.name) for config in CHAINS[chain]]
    runs = [stage["seed_everything"] for stage in stages]
    data = [stage["data"]["init_args"]["seed"] for stage in stages]
    assert len(set(runs)) == len(runs) and len(set(data)) == len(data), (runs, data)


def _first_draws(name: str, weights: dict[str, torch.Tensor] | None) -> dict[str, list]:
    """What stage ``name`` (at CPU size) draws first: its first batch of crops, the first
    step's view shifts, a training forward of the student (given ``weights``) on that batch
    (DAMP's noise, the CPE's windows and dropout) and the ViTDet schedule of 32 steps."""
    cli = cpu_sized(name, "--model.init_from=null")
    module, data = cli.model, cli.datamodule
    assert run_seed() == int(os.environ["PL_GLOBAL_SEED"]) == raw(name)["seed_everything"]
    if weights is not None:
        module.student.load_state_dict(weights)
    data.setup("fit")
    crops = next(iter(data.train_dataloader()))
    step = module.student_step
    step.begin(module.student, step=0, rank=0)
    chunks = step_views(crops, module.partitions, step, module.teachers, train=True)
    module.train()
    with torch.no_grad():
        outputs = [step.run(module.student, c.crop, c.resolution, None, True) for c in chunks]
    side = min(module.student.vitdet_window_sizes)  # a grid only that window tiles
    windowed = []
    for index in range(32):
        module.student.begin_step(run_seed(), index)
        windowed.append(module.student.vitdet_window((side, side)) is not None)
    return {
        "crops": [crops],
        "shifts": [s for c in chunks for s in (c.shifts.student, *c.shifts.teachers.values())],
        "forward": [o.features for o in outputs],
        "vitdet": [torch.tensor(windowed)],
        "weights": module.student.state_dict(),
    }


@pytest.mark.slow
def test_chained_stages_draw_different_crops_shifts_noise_and_vitdet():
    """C-RADIOv4 stages 1 and 2, stage 2 from stage 1's student weights (as init_from gives
    them): each draw differs; stage 1 built again draws the same (the difference is the
    seeds', not chance)."""
    first = _first_draws("recipes/c-radio/stage1.yaml", None)
    again = _first_draws("recipes/c-radio/stage1.yaml", first["weights"])
    second = _first_draws("recipes/c-radio/stage2.yaml", first["weights"])
    for what in ("crops", "shifts", "forward", "vitdet"):
        assert all(map(torch.equal, first[what], again[what])), what
        assert not all(map(torch.equal, first[what], second[what])), what
